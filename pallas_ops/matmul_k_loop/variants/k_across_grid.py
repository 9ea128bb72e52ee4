"""Bug (GPU): K split across a third grid axis, (M/BM, N/BN, K/BK), accumulating into the
output block, as a TPU matmul may: right in interpret mode and on a TPU, whose grid runs in
order, but GPU grid programs run concurrently and the K programs of one output block race on
it. The golden contracts K in a loop inside one program."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 128, 128, 128


def _precision(x):
    """HIGHEST for float32 operands: a TPU computes DEFAULT in one bfloat16 pass and a GPU in
    TF32, both ~1e-2 off. None for bfloat16 ones, exact either way (Mosaic refuses HIGHEST)."""
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(
        a_ref[...], b_ref[...], preferred_element_type=jnp.float32, precision=_precision(a_ref)
    )


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, BM), pl.cdiv(n, BN), pl.cdiv(k, BK)),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)
