"""Bug: out_shape is float32 whatever the input dtype, so bfloat16 inputs get a float32 result
(the statistics are float32 and the author kept that dtype); float32 inputs are unaffected."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8
LANES = 128
EPS = 1e-5


def _layer_norm_body(x_ref, g_ref, b_ref, o_ref, *, n_cols):
    x = x_ref[...].astype(jnp.float32)
    col = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    valid = col < n_cols
    x = jnp.where(valid, x, 0.0)
    mean = jnp.sum(x, axis=-1, keepdims=True) / n_cols
    centred = jnp.where(valid, x - mean, 0.0)
    var = jnp.sum(centred * centred, axis=-1, keepdims=True) / n_cols
    y = centred * jax.lax.rsqrt(var + EPS)
    y = y * g_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def kernel(x, gamma, beta):
    rows, cols = x.shape
    padded = pl.cdiv(cols, LANES) * LANES
    xp = jnp.pad(x, ((0, 0), (0, padded - cols)))
    gp = jnp.pad(gamma, (0, padded - cols)).reshape(1, padded)
    bp = jnp.pad(beta, (0, padded - cols)).reshape(1, padded)
    out = pl.pallas_call(
        functools.partial(_layer_norm_body, n_cols=cols),
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[
            pl.BlockSpec((BLOCK_R, padded), lambda i: (i, 0)),
            pl.BlockSpec((1, padded), lambda i: (0, 0)),
            pl.BlockSpec((1, padded), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((BLOCK_R, padded), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, padded), jnp.float32),
    )(xp, gp, bp)
    return out[:, :cols]
