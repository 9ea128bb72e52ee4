"""Bug (TPU): x and y travel as rank-1 (BK,) and (BM,) blocks, the natural shapes of a vector.
Right in interpret mode, but the TPU lowering takes a rank-1 block only when it is the whole
array, a multiple of 1024 or a power of two of at least 128 (one row of lanes): the (64,) block of
the output vector is none of these, so the kernel does not compile for TPU. The golden passes x
as a (K, 1) column and gets y as an (M, 1) one, tiled like any 2-D block."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _precision(x):
    """HIGHEST for float32 operands: a TPU's MXU computes DEFAULT in one bfloat16 pass, off by
    ~1e-2. None for bfloat16 ones, exact in one pass (Mosaic refuses HIGHEST for them)."""
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None


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
    o_ref[...] += jnp.dot(a, x, preferred_element_type=jnp.float32, precision=_precision(a))


def kernel(a, x):
    m, k = a.shape
    return pl.pallas_call(
        functools.partial(_matvec_body, k_size=k),
        grid=(pl.cdiv(m, BM), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, kk: (i, kk)),
            pl.BlockSpec((BK,), lambda i, kk: (kk,)),
        ],
        out_specs=pl.BlockSpec((BM,), lambda i, kk: (i,)),
        out_shape=jax.ShapeDtypeStruct((m,), jnp.float32),
    )(a, x)
