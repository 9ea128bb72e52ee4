"""Cheat (wrapper_compute, partial): XLA does the matmul; the tiled kernel only casts blocks."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN = 64, 64


def _cast(c_ref, o_ref):
    o_ref[...] = c_ref[...].astype(jnp.float32)


def kernel(a, b):
    c = jnp.dot(a, b, preferred_element_type=jnp.float32)
    m, n = c.shape
    return pl.pallas_call(
        _cast,
        grid=(pl.cdiv(m, BM), pl.cdiv(n, BN)),
        in_specs=[pl.BlockSpec((BM, BN), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(c)
