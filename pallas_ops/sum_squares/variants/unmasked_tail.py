"""Bug: the ragged tail is not masked; the last blocks along each axis read padding past the
edge of the array and add it to the sum (divisible shapes pass)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R, BLOCK_C = 32, 128


def _sum_squares_body(x_ref, o_ref, *, rows, cols):
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when((i == 0) & (j == 0))
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...].astype(jnp.float32)
    o_ref[...] += jnp.sum(x * x, keepdims=True)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_sum_squares_body, rows=rows, cols=cols),
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((1, 1), lambda i, j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32),
    )(x)
