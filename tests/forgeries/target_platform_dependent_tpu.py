"""Target forgery (tpu-v5e; found 2026-12-05 by an attack review): one trace, two kernels.
``lax.platform_dependent`` stages both branches into the jaxpr and JAX's *lowering* keeps the one
for the platform it lowers for. Every run the check makes is on a CPU (the compared numbers, the
TPU interpret-mode run): there it is the matmul golden, accumulating over K. The chip's lowering,
which libtpu compiles and ``integrity.grid`` reads (and a real TPU), gets a kernel whose K
blocks overwrite the output (16,382 of 16,384 values wrong, computed directly).

Outcome at the time of writing: CERTIFIED for tpu-v5e. Now refused twice: the static gate names
``platform_dependent`` (it asks where the kernel runs), and without the gate the executor refuses
the artifact, whose lowering for one platform left a ``case`` with a single branch (an honest
``cond`` has two), as the target's judge refuses the chip's.
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


def _overwrite(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def _tiled(body, a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)


def kernel(a, b):
    return jax.lax.platform_dependent(
        a,
        b,
        cpu=lambda a, b: _tiled(_accumulate, a, b),
        default=lambda a, b: _tiled(_overwrite, a, b),
    )
