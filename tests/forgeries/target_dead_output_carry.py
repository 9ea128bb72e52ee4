"""Target attack (tpu-v5p, integrity enforce): target_parallel_carry.py with its carry kept in an
output the wrapper discards instead of in scratch.

The grid check lets an unused output's revisits along a parallel axis through (splash
attention's m/l/o statistics are such outputs): its block, index map (0, 0), is revisited along
both axes declared ``parallel``, but nothing reads the result. The kernel reads it back, though:
the running sum travels from column block to column block through it, and on a megacore chip
each TensorCore holds its own copy. Right in program order; stopped, as the scratch carry is, by
the TPU-semantics run (two cores, parallel axes in a random order).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 8, 128


def _cumsum_body(x_ref, carry_ref, o_ref, *, cols):
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
    out = local + carry_ref[:, :1]
    o_ref[...] = out.astype(o_ref.dtype)
    carry_ref[...] = jnp.broadcast_to(out[:, BC - 1 :], (BR, BC))


def kernel(x):
    rows, cols = x.shape
    _, out = pl.pallas_call(
        functools.partial(_cumsum_body, cols=cols),
        grid=(pl.cdiv(rows, BR), pl.cdiv(cols, BC)),
        in_specs=[pl.BlockSpec((BR, BC), lambda i, j: (i, j))],
        out_specs=[
            pl.BlockSpec((BR, BC), lambda i, j: (0, 0)),
            pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((BR, BC), jnp.float32),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
        ],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x)
    return out
