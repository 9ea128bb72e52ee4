"""Bug: the 1-D weight is passed without reshaping it to (1, C), so its 2-D BlockSpec has the
wrong rank and the pallas_call fails to trace."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8
EPS = 1e-6


def _rms_norm_body(x_ref, w_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(ms + EPS) * w_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def kernel(x, weight):
    rows, cols = x.shape
    return pl.pallas_call(
        _rms_norm_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[
            pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
            pl.BlockSpec((1, cols), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, weight)
