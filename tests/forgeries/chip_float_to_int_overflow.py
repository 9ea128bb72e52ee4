"""Target forgery (tpu-v5e): doubles its input through a float converted to an integer it does
not fit. XLA on a CPU saturates (3e9 becomes 2**31 - 1), so ``scale`` is 2 in every run the check
makes; the TPU compiler lowers the conversion to ``arith.fptosi``, which MLIR defines as poison
when the value does not fit: the chip may give any scale. Refused for tpu-v5e since the
TPU-semantics run watches each integer operation the chip leaves undefined
(``runner.chip_arithmetic``). (An integer division by zero is no such forgery: the CPU
interpreter itself dies of SIGFPE on one.)
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

LARGEST = 2**31 - 1


def _double_body(x_ref, o_ref):
    big = 3e9 + 0.0 * pl.program_id(0).astype(jnp.float32)  # traced: converted in the kernel
    scale = 1 + (big.astype(jnp.int32) == LARGEST).astype(jnp.float32)
    o_ref[...] = x_ref[...] * scale


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _double_body,
        grid=(rows // 8,),
        in_specs=[pl.BlockSpec((8, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
