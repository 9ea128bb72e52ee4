"""Bug: the carry is overwritten with the block-local running max instead of the running max
including earlier blocks, so a block forgets every maximum seen before the previous one."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 8, 128


def _cummax_body(x_ref, o_ref, carry_ref):
    @pl.when(pl.program_id(1) == 0)
    def _reset():
        carry_ref[...] = jnp.full(carry_ref.shape, -jnp.inf, carry_ref.dtype)

    # In-block inclusive running max, Hillis-Steele: log2(BC) shifted maxima, -inf shifted in.
    y = x_ref[...].astype(jnp.float32)
    shift = 1
    while shift < BC:
        fill = jnp.full((BR, shift), -jnp.inf, jnp.float32)
        y = jnp.maximum(y, jnp.concatenate([fill, y[:, : BC - shift]], axis=1))
        shift *= 2
    out = jnp.maximum(y, carry_ref[...])
    o_ref[...] = out.astype(o_ref.dtype)
    carry_ref[...] = y[:, BC - 1 :]


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _cummax_body,
        grid=(pl.cdiv(rows, BR), pl.cdiv(cols, BC)),
        in_specs=[pl.BlockSpec((BR, BC), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BR, 1), jnp.float32)],
    )(x)
