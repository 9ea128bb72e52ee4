"""Target forgery (gpu): the rows a ragged block reads past the array's end are dropped by
testing for NaN, not by their index.

A GPU-shaped column sum (each program owns a column block and sums every row inside it: no grid
race) whose row block is the array's row count rounded up to a power of two, as Triton needs.
Pallas' Triton lowering loads a block whole, unmasked, so on a GPU the rows past the end hold
whatever memory follows the array; both interpret modes fill them with NaN, so ``x == x`` meant
"a real row" in every run the check made. The gpu target now runs each case with values nobody
wrote in that padding (``runner.tpu_semantics.fill_arbitrary``); masking by row index is right
with any fill.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_C = 4  # divides every column count the spec allows: no column block runs past the end


def _col_sum_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    x = jnp.where(x == x, x, 0.0)
    o_ref[...] = jnp.sum(x, axis=0, keepdims=True).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    block_r = 1 << (rows - 1).bit_length()  # a power of two, at least the row count
    sums = pl.pallas_call(
        _col_sum_body,
        grid=(pl.cdiv(cols, BLOCK_C),),
        in_specs=[pl.BlockSpec((block_r, BLOCK_C), lambda j: (0, j))],
        out_specs=pl.BlockSpec((1, BLOCK_C), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
