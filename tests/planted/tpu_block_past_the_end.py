"""Planted: one grid step too many. Its last row of blocks starts past the array's end: CPU
interpret mode clamps the block back in range (the numbers come out right), TPU semantics raise
an IndexError naming the block (8, 0) — the error a user must see, not a traceback's header."""

import jax
from jax.experimental import pallas as pl


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _double,
        grid=(rows // 8 + 1, cols // 128),  # the + 1: a row of blocks past the end
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
