"""Cheat (exception_fallback): a tiled kernel that quietly becomes `a @ b` when tiling fails."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN = 64, 64


def _matmul_body(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    try:
        return pl.pallas_call(
            _matmul_body,
            grid=(m // BM, n // BN),
            in_specs=[
                pl.BlockSpec((BM, k), lambda i, j: (i, 0)),
                pl.BlockSpec((k, BN), lambda i, j: (0, j)),
            ],
            out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        )(a, b)
    except (ValueError, NotImplementedError):
        return jnp.dot(a, b, preferred_element_type=jnp.float32)
