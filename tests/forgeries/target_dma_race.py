"""Target attack (tpu-v5e, integrity enforce): a race inside one program, where the grid has
nothing to say.

Doubles its input with no grid at all (one program): x stays in ``pl.ANY`` (HBM) and is fetched
8 rows at a time into a VMEM buffer by DMA, but each chunk is read *before* its DMA is waited
on. In CPU interpret mode a DMA completes when it starts, so the numbers are right; on a TPU the
vector unit reads the buffer while the DMA engine is still writing it. One program revisits
nothing, so ``integrity.grid`` is clean and Mosaic compiles it: only the TPU-semantics run (DMAs
complete on wait, fresh buffers NaN, race detector) can stop it.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR = 8


def _body(x_hbm, o_ref, buf_ref, sem):
    for chunk in range(o_ref.shape[0] // BR):
        rows = pl.ds(chunk * BR, BR)
        copy = pltpu.make_async_copy(x_hbm.at[rows], buf_ref, sem)
        copy.start()
        o_ref[rows, :] = buf_ref[...] * 2.0  # read before the wait: a race on TPU
        copy.wait()


def kernel(x):
    r, c = x.shape
    return pl.pallas_call(
        _body,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BR, c), jnp.float32), pltpu.SemaphoreType.DMA(())],
    )(x)
