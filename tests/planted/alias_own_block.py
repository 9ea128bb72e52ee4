"""Honest counterpart of ``tests/forgeries/target_alias_neighbour.py`` (spec
``tests/forgeries/target_shift_spec.py``): the same in-place update through an aliased buffer,
race-free on a GPU. Each program reads from the aliased buffer only the block it writes; the
next block comes from ``x``, which no program writes."""

import jax
from jax.experimental import pallas as pl

BR = 8


def _copy_body(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _add_next_body(this_ref, next_ref, o_ref):
    o_ref[...] = this_ref[...] + next_ref[...]


def kernel(x):
    r, c = x.shape
    last = r // BR - 1
    y = pl.pallas_call(
        _copy_body,
        grid=(r // BR,),
        in_specs=[pl.BlockSpec((BR, c), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, c), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    return pl.pallas_call(
        _add_next_body,
        grid=(r // BR,),
        in_specs=[
            pl.BlockSpec((BR, c), lambda i: (i, 0)),  # aliased: the block this program writes
            pl.BlockSpec((BR, c), lambda i: (jax.numpy.minimum(i + 1, last), 0)),  # x, read-only
        ],
        out_specs=pl.BlockSpec((BR, c), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
    )(y, x)
