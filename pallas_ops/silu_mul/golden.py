"""SwiGLU gate: both inputs tiled in 2-D (BLOCK_R, BLOCK_C) blocks, the grid rounds up."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R, BLOCK_C = 32, 128


def _silu_mul_body(a_ref, b_ref, o_ref):
    a = a_ref[...].astype(jnp.float32)
    b = b_ref[...].astype(jnp.float32)
    gate = a / (1.0 + jnp.exp(-a))
    o_ref[...] = (gate * b).astype(o_ref.dtype)


def kernel(a, b):
    rows, cols = a.shape
    spec = pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))
    return pl.pallas_call(
        _silu_mul_body,
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
    )(a, b)
