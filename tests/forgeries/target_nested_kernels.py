"""Target attack (gpu, integrity enforce): the racing kernel hidden among others, inside a branch.

Two pallas_calls: a harmless elementwise one (A * 1, one block per grid point) first, then the
matmul golden — K accumulated across the grid, a race where GPU programs run concurrently —
inside one branch of a ``lax.cond`` on the data, the other branch returning zeros. The grid check
must find the kernel inside the ``stablehlo.case`` region of the TPU lowering, and judge every
kernel of the artifact, not the first.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 128, 128, 128


def _copy_body(a_ref, o_ref):
    o_ref[...] = a_ref[...] * 1.0


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def _matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)


def _zeros(a, b):
    return jnp.zeros((a.shape[0], b.shape[1]), jnp.float32)


def kernel(a, b):
    m, k = a.shape
    bm = min(BM, m)
    a = pl.pallas_call(
        _copy_body,
        grid=(pl.cdiv(m, bm),),
        in_specs=[pl.BlockSpec((bm, k), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm, k), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
    )(a)
    return jax.lax.cond(jnp.isfinite(a[0, 0]), _matmul, _zeros, a, b)
