"""Bug: the running sum is rounded to bfloat16 between K steps (the author keeps the carried
accumulator in bfloat16 to halve its traffic), so every step adds a bfloat16 rounding error."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _precision(x):
    """HIGHEST for float32 operands: a TPU's MXU computes DEFAULT in one bfloat16 pass, off by
    ~1e-2. None for bfloat16 ones, exact in one pass (Mosaic refuses HIGHEST for them)."""
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None


# TPU blocks are 2-D, their last two dims a multiple of (8, 128) or the array's whole dim:
# x travels as a (K, 1) column and y as an (M, 1) column.
BM, BK = 64, 128


def _matvec_body(a_ref, x_ref, o_ref, *, k_size):
    kk = pl.program_id(1)

    @pl.when(kk == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    a = a_ref[...]
    x = x_ref[...]
    a_col = kk * BK + jax.lax.broadcasted_iota(jnp.int32, a.shape, 1)
    x_idx = kk * BK + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
    a = jnp.where(a_col < k_size, a, jnp.zeros_like(a))
    x = jnp.where(x_idx < k_size, x, jnp.zeros_like(x))
    partial = jnp.dot(a, x, preferred_element_type=jnp.float32, precision=_precision(a))
    acc = o_ref[...].astype(jnp.bfloat16) + partial.astype(jnp.bfloat16)
    o_ref[...] = acc.astype(o_ref.dtype)


def kernel(a, x):
    m, k = a.shape
    y = pl.pallas_call(
        functools.partial(_matvec_body, k_size=k),
        grid=(pl.cdiv(m, BM), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, kk: (i, kk)),
            pl.BlockSpec((BK, 1), lambda i, kk: (kk, 0)),
        ],
        out_specs=pl.BlockSpec((BM, 1), lambda i, kk: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), jnp.float32),
    )(a, x.reshape(k, 1))
    return y.reshape(m)
