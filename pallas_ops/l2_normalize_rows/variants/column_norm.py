"""Bug: the sum of squares runs over axis 0 (the BLOCK_R rows of the tile) instead of the last
axis, so every element is divided by its column norm within the tile, not by its row norm."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8
EPS = 1e-12


def _l2_normalize_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    sq = jnp.sum(x * x, axis=0, keepdims=True)
    o_ref[...] = (x * jax.lax.rsqrt(jnp.maximum(sq, EPS * EPS))).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _l2_normalize_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
