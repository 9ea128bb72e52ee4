"""Planted: right in interpret mode, refused by TPU: its (8, 64) blocks are not multiples of the
(8, 128) tiling nor the whole array's last dim (64 x 256 inputs)."""

import jax
from jax.experimental import pallas as pl


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(  # the misaligned BlockSpecs
        _double,
        grid=(rows // 8, cols // 64),
        in_specs=[pl.BlockSpec((8, 64), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 64), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
