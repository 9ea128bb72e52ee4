"""Target forgery (tpu-v5e, integrity enforce, passes the static gate): the DMA race of
``target_dma_race.py``, byte for byte, with the TPU-semantics run downgraded by the candidate.

``target_dma_race.py`` (a chunk read before its DMA is waited on, one program) is stopped for
tpu-v5e only by the TPU-semantics run's race detector: one program has no grid to judge, and
Mosaic compiles it. That run traces the candidate again, in the candidate's own process. This file
builds the same ``pallas_call`` under ``pltpu.force_tpu_interpret_mode(True)`` (public API: JAX's
plain interpret mode, where a DMA completes when it starts) when it is traced for that run, told
from the export by counting traces of a shape under the chip's abstract mesh (the export is the
first; ``runner.tpu_semantics`` comes after every export).

Outcome at the time of writing: CERTIFIED for tpu-v5e, and the artifact the engine compiled for
tpu-v5e is the racing kernel. Left without a test on purpose; a fix should make a test assert
``not report.certified`` and a ``race_detected`` finding.

Now: the static gate refuses the question it asks (config_tamper), and without the gate one
trace per shape (``runner.traced_program``) shows every artifact the same kernel
(``test_target_forgeries``).
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


def _double(x):
    r, c = x.shape
    return pl.pallas_call(
        _body,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BR, c), jnp.float32), pltpu.SemaphoreType.DMA(())],
    )(x)


def kernel(x):
    if _semantics_run(x):
        with pltpu.force_tpu_interpret_mode(True):  # plain interpret: a DMA completes at once
            return _double(x)
    return _double(x)
