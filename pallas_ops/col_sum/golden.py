"""Column sums: grid (C/BC, R/BR), the row (reduction) axis last; the (BC,) output accumulates."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

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
    o_ref[...] += jnp.sum(x, axis=0).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_col_sum_body, rows=rows),
        grid=(pl.cdiv(cols, BLOCK_C), pl.cdiv(rows, BLOCK_R)),
        in_specs=[pl.BlockSpec((BLOCK_R, BLOCK_C), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((BLOCK_C,), lambda j, i: (j,)),
        out_shape=jax.ShapeDtypeStruct((cols,), x.dtype),
    )(x)
