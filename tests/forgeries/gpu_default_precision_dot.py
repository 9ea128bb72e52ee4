"""Target forgery (gpu): a float32 dot at DEFAULT precision, right only where float32 is exact.

A GPU-shaped matmul (each program owns one output row block and contracts the whole K inside it:
no grid race) whose dot passes no precision. Pallas' Triton lowering gives such a float32 dot
``inputPrecision = tf32``: the tensor cores read each operand with a 10-bit mantissa, about 5e-2
off on this spec's float32 cases at atol 1e-4. Every CPU run computes it in float32, so it was
certified for gpu until the gpu target computed dots as a GPU does
(``runner.chip_arithmetic``, TF32). With ``precision=jax.lax.Precision.HIGHEST`` (``ieee``) the
same kernel is right on the GPU, and on a TPU (six bfloat16 passes).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 64
PRECISION = None


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
