"""Bug: the accumulator reset is keyed to program_id(2) -- the K axis of a 2-D matmul grid, but
the N axis of this 4-D one -- so the first N block is zeroed at every K step (keeping only
the last K block's product) and later N blocks are never zeroed."""

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


def _bmm_body(a_ref, b_ref, o_ref, *, k_size):
    kk = pl.program_id(3)

    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    a = a_ref[0]
    b = b_ref[0]
    a_col = kk * BK + jax.lax.broadcasted_iota(jnp.int32, a.shape, 1)
    b_row = kk * BK + jax.lax.broadcasted_iota(jnp.int32, b.shape, 0)
    a = jnp.where(a_col < k_size, a, jnp.zeros_like(a))
    b = jnp.where(b_row < k_size, b, jnp.zeros_like(b))
    o_ref[0] += jnp.dot(a, b, preferred_element_type=jnp.float32, precision=_precision(a))


def kernel(a, b):
    bsz, m, k = a.shape
    n = b.shape[2]
    bm, bn = min(BM, m), min(BN, n)
    return pl.pallas_call(
        functools.partial(_bmm_body, k_size=k),
        grid=(bsz, pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((1, bm, BK), lambda bi, i, j, kk: (bi, i, kk)),
            pl.BlockSpec((1, BK, bn), lambda bi, i, j, kk: (bi, kk, j)),
        ],
        out_specs=pl.BlockSpec((1, bm, bn), lambda bi, i, j, kk: (bi, i, j)),
        out_shape=jax.ShapeDtypeStruct((bsz, m, n), jnp.float32),
    )(a, b)
