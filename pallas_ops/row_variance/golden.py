"""Row variance: one block of BLOCK_R full rows per grid step, two passes over the block in VMEM."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# TPU blocks are 2-D, their last two dims a multiple of (8, 128) or the array's whole dim:
# one variance per row leaves as an (R, 1) column.
BLOCK_R = 8


def _variance_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    n = x.shape[-1]
    mean = jnp.sum(x, axis=-1, keepdims=True) / n
    centred = x - mean
    o_ref[...] = (jnp.sum(centred * centred, axis=-1, keepdims=True) / n).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    var = pl.pallas_call(
        _variance_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 1), x.dtype),
    )(x)
    return var.reshape(rows)
