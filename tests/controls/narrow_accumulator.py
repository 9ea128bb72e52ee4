"""Planted: the row sum accumulates column by column in the input's own dtype — exact enough in
float32, hundreds of bfloat16 roundings in a bfloat16 run."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _body(x_ref, o_ref):
    x = x_ref[...]

    def add_column(j, acc):
        return acc + jax.lax.dynamic_slice_in_dim(x, j, 1, axis=1)[:, 0]

    acc = jnp.zeros((x.shape[0],), x.dtype)  # the bug: acc_dtype = x.dtype
    o_ref[...] = jax.lax.fori_loop(0, x.shape[1], add_column, acc)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R,), lambda i: (i,)),
        out_shape=jax.ShapeDtypeStruct((rows,), x.dtype),
    )(x)
