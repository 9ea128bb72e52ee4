"""Forgery: the embedding lookup done outside the kernel, one row per turn of a counted loop,
each row read with ``dynamic_slice`` at the position its id gives; the pallas_call only copies.

A slice was layout glue, priced 0 wherever its position came from: the whole gather counted
for nothing, and it was certified. A slice whose position is data is a gather of one window.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(table, ids):
    rows, width = ids.shape[0], table.shape[1]

    def turn(i, out):
        row = lax.dynamic_slice(table, (ids[i], 0), (1, width))
        return lax.dynamic_update_slice(out, row, (i, 0))

    gathered = lax.fori_loop(0, rows, turn, jnp.zeros((rows, width), table.dtype))
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(gathered.shape, table.dtype))(
        gathered
    )
