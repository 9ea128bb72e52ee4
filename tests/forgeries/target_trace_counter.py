"""Target forgery (tpu-v5e, integrity enforce, asks JAX nothing): one kernel for the first trace
of each shape, another for every later one.

A check used to trace the candidate several times for one shape: once for the CPU interpret
export whose numbers are compared, once for the chip's lowering, once more for the run under TPU
interpret mode. The kernel counts its own traces in a module-level list:

- the first trace — the compared numbers, and the *only* trace a real TPU ever makes — is
  ``pallas_ops/matmul/variants/tpu_misaligned_block.py``: (64, 64) tiles, right in program order,
  refused by the TPU compiler;
- every later trace is the matmul golden, (128, 128) tiles, which Mosaic compiles.

Outcome with separate traces: CERTIFIED for tpu-v5e while on a TPU v5e this file does not
compile. With one trace per shape, every artifact (numbers, chip lowering, TPU-semantics run)
is derived from the same traced program, so the chip compiles the (64, 64) kernel and refuses it.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_TRACES: list[int] = []


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    _TRACES.append(len(_TRACES))
    tile = 64 if len(_TRACES) == 1 else 128  # 64: misaligned for TPU
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(tile, m), min(tile, n), min(tile, k)
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
