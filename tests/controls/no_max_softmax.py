"""Planted: the softmax exponentiates without subtracting the row maximum, right for normal
inputs, Inf/Inf = NaN once a value passes ~88 (the large-magnitude profile)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _body(x_ref, o_ref):
    e = jnp.exp(x_ref[...])
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
