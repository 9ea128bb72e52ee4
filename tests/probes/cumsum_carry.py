"""Probe for pallas_ops/cumsum_rows/variants/reset_once.py: the same kernel, with the carry each
grid step starts from written to an extra output (one column per column block), so it can be
compared with the row totals the carry should hold."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BR, BC = 8, 128


def _body(x_ref, o_ref, carry_in_ref, carry_ref, *, cols):
    j = pl.program_id(1)

    @pl.when((pl.program_id(0) == 0) & (j == 0))
    def _reset():
        carry_ref[...] = jnp.zeros_like(carry_ref)

    carry_in_ref[...] = carry_ref[...]  # the instrumentation: the carry this step starts from
    col = j * BC + jax.lax.broadcasted_iota(jnp.int32, (BR, BC), 1)
    x = jnp.where(col < cols, x_ref[...].astype(jnp.float32), 0.0)
    k = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 0)
    c = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 1)
    tri = (k <= c).astype(jnp.float32)
    local = jnp.dot(x, tri, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    out = local + carry_ref[...]
    o_ref[...] = out.astype(o_ref.dtype)
    carry_ref[...] = out[:, BC - 1 :]


def probe(x):
    rows, cols = x.shape
    blocks = pl.cdiv(cols, BC)
    out, carry_in = pl.pallas_call(
        functools.partial(_body, cols=cols),
        grid=(pl.cdiv(rows, BR), blocks),
        in_specs=[pl.BlockSpec((BR, BC), lambda i, j: (i, j))],
        out_specs=[
            pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
            pl.BlockSpec((BR, 1), lambda i, j: (i, j)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct((rows, blocks), jnp.float32),
        ],
        scratch_shapes=[pl.ANY((BR, 1), jnp.float32)],
    )(x)
    return {"out": out, "carry_in": carry_in}
