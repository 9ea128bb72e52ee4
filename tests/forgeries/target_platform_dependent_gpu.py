"""Target forgery (gpu; found 2026-12-05 by an attack review): the gpu verdict's grid is read from
a TPU lowering of the trace, so ``lax.platform_dependent`` shows it a kernel that reduces K inside
one program (each output block written once), while the CPU (the compared numbers) and CUDA (a
real GPU) get the K-grid accumulation, whose programs race on a GPU: the golden alone fails the
gpu target with ``grid_race``.

Outcome at the time of writing: CERTIFIED for gpu. Now refused as
``target_platform_dependent_tpu.py`` is: by the static gate, and without it by the executor.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 128, 128, 128


def _accumulate(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def _whole_k(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def _k_grid(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        _accumulate,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)


def _one_program_k(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn = min(BM, m), min(BN, n)
    return pl.pallas_call(
        _whole_k,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
            pl.BlockSpec((k, bn), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)


def kernel(a, b):
    return jax.lax.platform_dependent(a, b, cpu=_k_grid, cuda=_k_grid, default=_one_program_k)
