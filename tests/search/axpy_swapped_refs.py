"""x - 0.5 * y, with the body's input refs in the wrong order: the call passes (x, y), the body
names them (y, x). No recipe knows this bug; a swap of the two parameters repairs it."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_ROWS = 32


def _axpy_body(y_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] - 0.5 * y_ref[...]


def kernel(x, y):
    rows, cols = x.shape
    spec = pl.BlockSpec((BLOCK_ROWS, cols), lambda i: (i, 0))
    return pl.pallas_call(
        _axpy_body,
        grid=(pl.cdiv(rows, BLOCK_ROWS),),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
    )(x, y)
