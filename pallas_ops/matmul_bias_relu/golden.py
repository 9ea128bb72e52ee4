"""Matmul: grid (M/BM, N/BN, K/BK), K innermost and masked; last K step adds bias, ReLU."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _precision(x):
    """HIGHEST for float32 operands: a TPU's MXU computes DEFAULT in one bfloat16 pass, off by
    ~1e-2. None for bfloat16 ones, exact in one pass (Mosaic refuses HIGHEST for them)."""
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None


# TPU blocks: the last two dims a multiple of (8, 128) — (16, 128) for bfloat16 — or the
# array's whole dim; min() takes the whole dim of an array smaller than one block
# (K keeps BK: its ragged tail is masked).
BM, BN, BK = 128, 128, 128


def _matmul_bias_relu_body(a_ref, b_ref, bias_ref, o_ref, *, k_size):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    a = a_ref[...]
    b = b_ref[...]
    a_col = kk * BK + jax.lax.broadcasted_iota(jnp.int32, a.shape, 1)
    b_row = kk * BK + jax.lax.broadcasted_iota(jnp.int32, b.shape, 0)
    a = jnp.where(a_col < k_size, a, jnp.zeros_like(a))
    b = jnp.where(b_row < k_size, b, jnp.zeros_like(b))
    o_ref[...] += jnp.dot(a, b, preferred_element_type=jnp.float32, precision=_precision(a))

    @pl.when(kk == pl.num_programs(2) - 1)
    def _epilogue():
        o_ref[...] = jnp.maximum(o_ref[...] + bias_ref[...].astype(jnp.float32), 0.0)


def kernel(a, b, bias):
    m, k = a.shape
    n = b.shape[1]
    bm, bn = min(BM, m), min(BN, n)
    return pl.pallas_call(
        functools.partial(_matmul_bias_relu_body, k_size=k),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((bm, BK), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((BK, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b, bias.reshape(1, n))
