"""Target attack (tpu-v5e): a kernel that asks to be interpreted, so that no chip compiler ever
sees it. ``pallas_ops/matmul/variants/tpu_misaligned_block.py`` — (64, 64) tiles, right in
interpret mode, refused by the TPU compiler — with ``interpret=True`` passed to its
``pallas_call``. A pallas_call built with it lowers to plain HLO, with no Mosaic kernel for the
chip to refuse. The engine owns the execution mode: the chip's artifact re-evaluates the traced
program with every pallas_call set for the chip's compiler, so the tiling is refused all the
same, and the gate only notes the keyword.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 64, 64, 64


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
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
        interpret=True,
    )(a, b)
