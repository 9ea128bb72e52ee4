"""Target forgery (tpu-v5e; found 2026-12-05 by an attack review): the cumsum carry is never
reset. The last column block poisons it with NaN after use, and every block reads a NaN carry as
0: right wherever a fresh scratch buffer holds NaN, as in both interpret modes. On a TPU the
first row block starts from whatever an earlier kernel left in that VMEM: with a fill of 3.0 it
is off by 3.0 on every case. Refused since the TPU-semantics run's second run fills fresh
buffers with values drawn from the check's seed (see ``fill_nan_padding_mask.py``).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 8, 128


def _cumsum_body(x_ref, o_ref, carry_ref, *, cols):
    j = pl.program_id(1)
    col = j * BC + jax.lax.broadcasted_iota(jnp.int32, (BR, BC), 1)
    x = jnp.where(col < cols, x_ref[...].astype(jnp.float32), 0.0)
    k = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 0)
    c = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 1)
    tri = (k <= c).astype(jnp.float32)
    local = jnp.dot(x, tri, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    carry = carry_ref[...]
    carry = jnp.where(carry == carry, carry, 0.0)
    out = local + carry
    o_ref[...] = out.astype(o_ref.dtype)
    last = j == pl.num_programs(1) - 1
    carry_ref[...] = jnp.where(last, jnp.nan, out[:, BC - 1 :])


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
