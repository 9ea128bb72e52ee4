"""Planted: the width is padded to a multiple of 128 and the mean divides by the true width, but
the variance sums the padded lanes unmasked — each adds mean², so a ragged width is wrong at any
values (a little with normal inputs, a lot with an offset) and an aligned width is right."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8
LANES = 128
EPS = 1e-5


def _body(x_ref, o_ref, *, n_cols):
    x = x_ref[...]
    mean = jnp.sum(x, axis=-1, keepdims=True) / n_cols  # the padded lanes are zeros: right
    centred = x - mean  # ... but here they become -mean, and nothing masks them
    var = jnp.sum(centred * centred, axis=-1, keepdims=True) / n_cols
    o_ref[...] = centred * jax.lax.rsqrt(var + EPS)


def kernel(x):
    rows, cols = x.shape
    padded = pl.cdiv(cols, LANES) * LANES
    xp = jnp.pad(x, ((0, 0), (0, padded - cols)))
    out = pl.pallas_call(
        functools.partial(_body, n_cols=cols),
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, padded), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, padded), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, padded), x.dtype),
    )(xp)
    return out[:, :cols]
