"""Probe for pallas_ops/matmul/variants/missing_init.py: the same kernel, also writing the
accumulator as the first K step finds it — before anything was added to it."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 64, 64, 128


def _body(a_ref, b_ref, o_ref, first_ref):
    @pl.when(pl.program_id(2) == 0)
    def _capture():
        first_ref[...] = o_ref[...]  # the instrumentation

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def probe(a, b):
    m, k = a.shape
    n = b.shape[1]
    out, first = pl.pallas_call(
        _body,
        grid=(pl.cdiv(m, BM), pl.cdiv(n, BN), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j)),
        ],
        out_specs=[pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j))] * 2,
        out_shape=[jax.ShapeDtypeStruct((m, n), jnp.float32)] * 2,
    )(a, b)
    return {"out": out, "accumulator_at_first_step": first}
