"""Cheat (wrapper_compute, partial): XLA does max, exp and sum; the kernel only divides."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _divide(e_ref, s_ref, o_ref):
    o_ref[...] = (e_ref[...] / s_ref[...]).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    xf = x.astype(jnp.float32)
    e = jnp.exp(xf - jnp.max(xf, axis=-1, keepdims=True))
    s = jnp.sum(e, axis=-1, keepdims=True)
    return pl.pallas_call(
        _divide,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[
            pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
            pl.BlockSpec((BLOCK_R, 1), lambda i: (i, 0)),
        ],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(e, s)
