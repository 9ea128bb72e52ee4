"""Cheat (exception_fallback): when the kernel fails to build, XLA's softmax stands in."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    try:
        return pl.pallas_call(
            _softmax_body,
            grid=(pl.cdiv(rows, BLOCK_R),),
            in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)
    except Exception:
        return jax.nn.softmax(x, axis=-1)
