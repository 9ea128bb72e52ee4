"""Tiled matmul with an index_map of the wrong arity."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 64, 64, 128


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, BM), pl.cdiv(n, BN), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, j: (i, 0)),
            pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)
