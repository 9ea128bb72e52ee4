"""Bug: the input index_map ignores the column-block index and always reads column block 0,
so every output block holds the sums of the first BLOCK_C columns."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# TPU blocks are 2-D, their last two dims a multiple of (8, 128) or the array's whole dim:
# the sums leave as a (1, C) row.
BLOCK_R, BLOCK_C = 32, 128


def _col_sum_body(x_ref, o_ref, *, rows):
    i = pl.program_id(1)

    @pl.when(i == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...].astype(jnp.float32)
    # Rows past the edge of the last block hold padding: mask them out of the sum.
    row = i * BLOCK_R + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
    x = jnp.where(row < rows, x, 0.0)
    o_ref[...] += jnp.sum(x, axis=0, keepdims=True).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    sums = pl.pallas_call(
        functools.partial(_col_sum_body, rows=rows),
        grid=(pl.cdiv(cols, BLOCK_C), pl.cdiv(rows, BLOCK_R)),
        in_specs=[pl.BlockSpec((BLOCK_R, BLOCK_C), lambda j, i: (i, 0))],
        out_specs=pl.BlockSpec((1, BLOCK_C), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
