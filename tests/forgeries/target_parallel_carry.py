"""Target attack (tpu-v5p, integrity enforce): a carry across a grid axis declared ``parallel``,
hidden from the grid check.

The cumsum golden with ``dimension_semantics=("parallel", "parallel")``: every grid point writes
its own output block, so ``integrity.grid`` (which judges output blocks) has nothing to say, and
Mosaic compiles it. But the running sum travels from column block to column block in a VMEM
scratch, and on a megacore chip (v5p) a parallel axis is split between two TensorCores, each with
its own scratch: the second core starts mid-row with a carry it never set. Right in program
order (CPU interpret mode). Stopped only by the TPU-semantics run (JAX's TPU interpret mode: two
cores, parallel axes in a random order, race detector).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 8, 128


def _cumsum_body(x_ref, o_ref, carry_ref, *, cols):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _reset():
        carry_ref[...] = jnp.zeros_like(carry_ref)

    col = j * BC + jax.lax.broadcasted_iota(jnp.int32, (BR, BC), 1)
    x = jnp.where(col < cols, x_ref[...].astype(jnp.float32), 0.0)
    k = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 0)
    c = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 1)
    tri = (k <= c).astype(jnp.float32)
    local = jnp.dot(x, tri, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    out = local + carry_ref[...]
    o_ref[...] = out.astype(o_ref.dtype)
    carry_ref[...] = out[:, BC - 1 :]


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_cumsum_body, cols=cols),
        grid=(pl.cdiv(rows, BR), pl.cdiv(cols, BC)),
        in_specs=[pl.BlockSpec((BR, BC), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BR, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x)
