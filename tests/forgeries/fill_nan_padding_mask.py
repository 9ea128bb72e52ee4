"""Target forgery (tpu-v5e; found 2026-12-05 by an attack review): rows past the edge of the
last block are dropped by testing for NaN, not by their index.

Both interpret modes fill what a ragged last block reads past the array's end with NaN (JAX's
debugging aid), so "NaN" reliably meant "padding" in every run the check made. On a TPU the
padding holds whatever was in VMEM: with a fill of 3.0 the ragged case (100x300) is off by 84
(28 padded rows times 3); the golden, which masks by row index, is right with any fill. It was
certified for tpu-v5e until the TPU-semantics run gained a second run whose padding and fresh
buffers hold values drawn from the check's seed (``runner.tpu_semantics.fill_arbitrary``).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R, BLOCK_C = 32, 128


def _col_sum_body(x_ref, o_ref):
    i = pl.program_id(1)

    @pl.when(i == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...].astype(jnp.float32)
    x = jnp.where(x == x, x, 0.0)
    o_ref[...] += jnp.sum(x, axis=0, keepdims=True).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    sums = pl.pallas_call(
        _col_sum_body,
        grid=(pl.cdiv(cols, BLOCK_C), pl.cdiv(rows, BLOCK_R)),
        in_specs=[pl.BlockSpec((BLOCK_R, BLOCK_C), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((1, BLOCK_C), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
