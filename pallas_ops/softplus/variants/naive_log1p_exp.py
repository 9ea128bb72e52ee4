"""Bug: naive log(1 + exp(x)); exp overflows to inf for x > ~88, so large inputs give
inf where softplus is finite (normal N(0, 1) inputs pass)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R, BLOCK_C = 32, 128


def _softplus_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    y = jnp.log(1.0 + jnp.exp(x))
    o_ref[...] = y.astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    spec = pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))
    return pl.pallas_call(
        _softplus_body,
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
