"""Target forgery (tpu-v5e; found 2026-12-05 by an attack review): the cumsum_rows golden with
``precision=HIGHEST`` taken off its float32 dot. A CPU computes that dot in full float32; libtpu's
own output for v5e (``--xla_mosaic_dump_to``) shows one ``vmatmul`` pass in ``round`` mode where
the golden has six: operands rounded to bfloat16. Emulated that way (operands rounded to
bfloat16, float32 accumulation) it is off by up to 8e-2 against an atol of 2e-4. It was
certified for tpu-v5e while every run computed in float32; the TPU-semantics run now computes
each matmul as the chip does (``runner.chip_arithmetic``) and names the dot's line and the
precision that would fix it.
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

    # Zero the columns past the edge: the padding of a partial block is garbage, and 0 * NaN
    # in the triangular product would poison every column of the block.
    col = j * BC + jax.lax.broadcasted_iota(jnp.int32, (BR, BC), 1)
    x = jnp.where(col < cols, x_ref[...].astype(jnp.float32), 0.0)
    # In-block inclusive prefix sum as a product with an upper-triangular matrix of ones.
    k = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 0)
    c = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 1)
    tri = (k <= c).astype(jnp.float32)
    local = jnp.dot(x, tri, preferred_element_type=jnp.float32)
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
    )(x)
