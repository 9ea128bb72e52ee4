"""Bug (TPU): one row per grid step, as a GPU softmax gives each program one row. Right in
interpret mode, but a TPU block's second-to-last dim must be a multiple of 8 or the array's whole
dim: a (1, C) block of a (64, C) array is refused by the TPU compiler."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 1  # one row per program


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    x = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x)
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _softmax_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
