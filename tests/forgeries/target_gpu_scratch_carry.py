"""Target attack (gpu, integrity enforce, no trick at all): state carried from one grid program
to the next in a scratch buffer, which the ``gpu`` verdict never looks at.

This is ``pallas_ops/cumsum_rows/golden.py`` unchanged: the running sum of a row travels from
column block j to column block j+1 in a (BR, 1) VMEM scratch, reset at j = 0. Right on a TPU,
whose grid runs in order on one core (the axes are ``arbitrary``). On a GPU the grid programs
run concurrently and each has its own scratch, so every column block after the first starts
from a carry no program gave it; in fact Pallas' Triton lowering refuses scratch outright
("scratch memory not implemented in the Triton backend"). ``integrity.grid`` with GPU semantics
judges only the outputs' index maps (each output block is written once here) and the ``gpu``
target has no semantics run.

Outcome at the time of writing: ``check(cumsum_rows spec, this, targets=("gpu",))`` is CERTIFIED.
Left without a test on purpose; a fix (the gpu verdict refusing, or calling undetermined, any
kernel with scratch carried across grid points — for a GPU: any scratch operand at all on a grid
of more than one point) should make a test assert ``not report.certified``.

Now: the gpu verdict leaves a multi-program grid with scratch undetermined (not certified;
``test_target_forgeries``).
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
    )(x)
