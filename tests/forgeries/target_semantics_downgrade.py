"""Target forgery (tpu-v5p, integrity enforce, passes the static gate): the TPU-semantics run,
which runs in the candidate's own process, is downgraded to plain interpret mode by the candidate.

The kernel is ``target_parallel_carry.py`` byte for byte: the cumsum golden with its carried
column axis declared ``parallel``. That one is stopped for tpu-v5p only by the TPU-semantics run
(JAX's TPU interpret mode: two cores, parallel axes in a random order): grid and compile are clean.
This one builds its ``pallas_call`` under ``pltpu.force_tpu_interpret_mode(True)`` — a public
API, JAX's plain interpret mode, sequential, one core, no race detector — when it sees that it is
being traced for that run. It tells the run from the export by counting: the engine exports each
shape once under the chip's abstract mesh (``jax.sharding.get_abstract_mesh()``), and every later
trace of that shape under the mesh is the semantics run (``runner.tpu_semantics``).

Outcome at the time of writing: CERTIFIED for tpu-v5p, while the very artifact the engine
compiled for tpu-v5p (Mosaic, ``parallel`` on the carried axis) is the wrong kernel: on a
megacore v5p the second TensorCore starts mid-row with a carry it never set. The claim in
``runner.tpu_semantics`` ("a candidate that fakes a clean run here gains nothing — its numbers,
its compile for the chip and its grid are all judged elsewhere") does not hold: this run is the
only evidence against this kernel. Left without a test on purpose; a fix should make a test
assert ``not report.certified`` and the tpu-v5p target's ``order_dependent``/``race_detected``.

Now: the static gate refuses the question it asks (config_tamper), and without the gate one
trace per shape (``runner.traced_program``) shows every artifact the same kernel
(``test_target_forgeries``).
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


_TRACED_ON_CHIP: set = set()


def _semantics_run(x):
    """True when traced under the chip's abstract mesh for a shape already exported there."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is None or device.platform != "tpu":
        return False
    key = (tuple(x.shape), str(x.dtype), device.device_kind)
    seen = key in _TRACED_ON_CHIP
    _TRACED_ON_CHIP.add(key)
    return seen


def _cumsum(x):
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


def kernel(x):
    if _semantics_run(x):
        with pltpu.force_tpu_interpret_mode(True):  # plain interpret: in order, one core
            return _cumsum(x)
    return _cumsum(x)
