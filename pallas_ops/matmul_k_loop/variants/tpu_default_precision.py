"""Bug (TPU): the dot asks for DEFAULT precision, so a TPU computes its float32 operands in one
bfloat16 pass on the MXU: ~8e-2 off at atol 1e-4. Right in interpret mode, which computes
float32 exactly. The golden asks for HIGHEST where the operands are float32."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 128, 128, 128


def _precision(x):
    """HIGHEST for float32 operands: a TPU computes DEFAULT in one bfloat16 pass and a GPU in
    TF32, both ~1e-2 off. None for bfloat16 ones, exact either way (Mosaic refuses HIGHEST)."""
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None


def _matmul_body(a_ref, b_ref, o_ref):
    k = a_ref.shape[1]

    def step(kk, acc):
        start = pl.multiple_of(kk * BK, BK)
        a = a_ref[:, pl.ds(start, BK)]
        b = b_ref[pl.ds(start, BK), :]
        return acc + jnp.dot(
            a, b, preferred_element_type=jnp.float32, precision=jax.lax.Precision.DEFAULT
        )

    acc = jax.lax.fori_loop(0, k // BK, step, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, BM), pl.cdiv(n, BN)),
        in_specs=[
            pl.BlockSpec((BM, k), lambda i, j: (i, 0)),
            pl.BlockSpec((k, BN), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)
