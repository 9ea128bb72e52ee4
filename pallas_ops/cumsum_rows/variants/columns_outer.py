"""Bug: the column (scan) axis is placed before the row-block axis of the grid.

The (BR, 1) carry belongs to one row block; with columns outer, the row blocks of one column
step run back to back, so each inherits the previous row block's running totals."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 8, 128


def _cumsum_body(x_ref, o_ref, carry_ref, *, cols):
    j = pl.program_id(0)

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
    local = jnp.dot(x, tri, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    out = local + carry_ref[...]
    o_ref[...] = out.astype(o_ref.dtype)
    carry_ref[...] = out[:, BC - 1 :]


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_cumsum_body, cols=cols),
        grid=(pl.cdiv(cols, BC), pl.cdiv(rows, BR)),
        in_specs=[pl.BlockSpec((BR, BC), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((BR, BC), lambda j, i: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BR, 1), jnp.float32)],
    )(x)
