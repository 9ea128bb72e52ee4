"""Bug (TPU): the grid walks row blocks outermost, (R/BR, C/BC), in the input's row-major order.
Right in interpret mode, which re-reads an output block whenever it is revisited, but each
(1, BC) output block is left after one row block and accumulated into again at the next: TPU
writes a block back when the grid leaves it and does not read it again, so the sums restart. The
reduction (row) axis must come last."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# TPU blocks are 2-D, their last two dims a multiple of (8, 128) or the array's whole dim:
# the sums leave as a (1, C) row.
BLOCK_R, BLOCK_C = 32, 128


def _col_sum_body(x_ref, o_ref, *, rows):
    i = pl.program_id(0)

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
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((1, BLOCK_C), lambda i, j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
