"""Target forgery (gpu): a Mosaic GPU kernel whose blocks are two float32 columns wide.

Leaky ReLU in 2-D tiles, written for Mosaic GPU (``plgpu.CompilerParams``): right in every
interpret mode, but Mosaic GPU moves a block between global and shared memory with TMA copies,
which need at least 16 bytes along the last dimension, and its lowering refuses an 8-byte one.
The gpu target said "a Mosaic GPU kernel is not lowered without a GPU" and left such kernels
unverified, until the check ran Mosaic GPU's own lowering (``targets.triton``). With 128
columns the same kernel lowers, and certifies.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

BLOCK_R, BLOCK_C = 32, 2
NEGATIVE_SLOPE = 0.01


def _body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = jnp.where(x >= 0, x, NEGATIVE_SLOPE * x).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    spec = pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=plgpu.CompilerParams(),
    )(x)
