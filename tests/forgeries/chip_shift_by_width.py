"""Target forgery (tpu-v5e): doubles its input through a scale that a shift by the bit width
clears. ``2 << 32`` is 0 in XLA on a CPU, so ``scale = 2 + (2 << shift)`` is 2 in every run the
check makes; the TPU compiler keeps ``arith.shli %x, 32``, which MLIR defines as poison: the
chip may give any scale. Refused for tpu-v5e since the TPU-semantics run watches each integer
operation the chip leaves undefined (``runner.chip_arithmetic``), naming this file's line.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _double_body(x_ref, o_ref):
    shift = 32 + 0 * pl.program_id(0)  # traced: the shift happens in the kernel
    scale = 2 + (jnp.int32(2) << shift)
    o_ref[...] = x_ref[...] * scale.astype(jnp.float32)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _double_body,
        grid=(rows // 8,),
        in_specs=[pl.BlockSpec((8, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
