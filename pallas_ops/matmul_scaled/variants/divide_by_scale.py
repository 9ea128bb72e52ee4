"""Bug: the epilogue divides by the scale (as if it were a temperature) instead of multiplying,
so every output is off by the constant factor 1 / alpha**2."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _precision(x):
    """HIGHEST for float32 operands: a TPU's MXU computes DEFAULT in one bfloat16 pass, off by
    ~1e-2. None for bfloat16 ones, exact in one pass (Mosaic refuses HIGHEST for them)."""
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None


# TPU blocks: the last two dims a multiple of (8, 128) — (16, 128) for bfloat16 — or the
# array's whole dim; min() takes the whole dim of an array smaller than one block.
BM, BN, BK = 128, 128, 128


def _matmul_scaled_body(a_ref, b_ref, s_ref, o_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(
        a_ref[...],
        b_ref[...],
        preferred_element_type=jnp.float32,
        precision=_precision(a_ref),
    )

    @pl.when(kk == pl.num_programs(2) - 1)
    def _epilogue():
        o_ref[...] = o_ref[...] / s_ref[...]


def kernel(a, b, scale):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        _matmul_scaled_body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, 1), lambda i, j, kk: (0, 0)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b, scale.reshape(1, 1))
