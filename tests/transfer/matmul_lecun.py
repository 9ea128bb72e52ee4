"""Tiled matmul whose epilogue applies LeCun's scaled tanh on the last K step. Planted: the same
wrong inner slope as ``lecun_act.py``, at a deeper indentation between other neighbours."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN, BK = 64, 64, 128


def _body(a_ref, b_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _epilogue():
        x = acc_ref[...]
        y = 1.7159 * jnp.tanh(1.5 * x)
        o_ref[...] = y.astype(o_ref.dtype)


def kernel(a, b):
    m, kk = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(m, BM), pl.cdiv(n, BN), pl.cdiv(kk, BK)),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, j, k: (i, k)),
            pl.BlockSpec((BK, BN), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],
    )(a, b)
