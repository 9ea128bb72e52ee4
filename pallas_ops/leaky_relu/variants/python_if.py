"""Bug: a Python conditional on the traced block (`x if x >= 0 else ...`); the truth value of
a traced array is undefined, so tracing the kernel body fails."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R, BLOCK_C = 32, 128
NEGATIVE_SLOPE = 0.01


def _leaky_relu_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    y = x if x >= 0 else NEGATIVE_SLOPE * x
    o_ref[...] = y.astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    spec = pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))
    return pl.pallas_call(
        _leaky_relu_body,
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
