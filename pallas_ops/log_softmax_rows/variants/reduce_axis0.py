"""Bug: max and sum reduce over axis 0 (the rows of the block) instead of the last axis, so
each column of the block is normalised instead of each row."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _log_softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    shifted = x - jnp.max(x, axis=0, keepdims=True)
    lse = jnp.log(jnp.sum(jnp.exp(shifted), axis=0, keepdims=True))
    o_ref[...] = (shifted - lse).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _log_softmax_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
