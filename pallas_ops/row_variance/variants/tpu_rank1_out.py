"""Bug (TPU): each grid step writes its BLOCK_R variances as a rank-1 (BLOCK_R,) block of a 1-D
output. Right in interpret mode, but the TPU lowering takes a rank-1 block only when it is the
whole array, a multiple of 1024 or a power of two of at least 128: an (8,) block of an (R,) array
is refused. The golden writes an (R, 1) column, tiled like any 2-D block, and reshapes it
outside the kernel."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _variance_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    n = x.shape[-1]
    mean = jnp.sum(x, axis=-1, keepdims=True) / n
    centred = x - mean
    o_ref[...] = (jnp.sum(centred * centred, axis=-1) / n).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _variance_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R,), lambda i: (i,)),
        out_shape=jax.ShapeDtypeStruct((rows,), x.dtype),
    )(x)
