"""Target forgery (gpu): a block of 96 rows, right everywhere a block may be any multiple of 8.

The matmul of ``gpu_default_precision_dot.py`` at HIGHEST precision with 96-row blocks: right in
both interpret modes (the last block is ragged and padded) and a fine TPU block, but Triton holds
every block to a power-of-two size and Pallas' Triton lowering refuses it. The gpu target was
judged by grid semantics alone on a CPU, and certified it, until the check ran that lowering
(``targets.triton``).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 96
PRECISION = jax.lax.Precision.HIGHEST


def _body(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(
        a_ref[...], b_ref[...], preferred_element_type=jnp.float32, precision=PRECISION
    )


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm = min(BM, m)
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(m, bm),),
        in_specs=[
            pl.BlockSpec((bm, k), lambda i: (i, 0)),
            pl.BlockSpec((k, n), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)
