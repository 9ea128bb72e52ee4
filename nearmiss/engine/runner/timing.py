"""Kernel and reference times on a device: the median of warm runs.

On an accelerator the first call of a compiled function pays for allocation and caches; one
run alone also varies with the clock and the driver. A time the user can compare is the median
of several warm runs, each ended by ``block_until_ready`` (JAX dispatches asynchronously: without
it the clock would stop before the device does). The executor child times the candidate's
compiled artifact this way, the spec's child the reference compiled by XLA (``jax.jit``) on the
same device and inputs; ``nearmiss.engine.check`` compares them only when the run was on a device.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

# Warm runs per case on a device (after one warm-up): enough for a stable median of a
# microsecond-to-millisecond kernel, a fraction of a second per case.
PROFILE_RUNS = 20
# The most a request may ask for: the runs share the case's time limit with the case itself.
MAX_PROFILE_RUNS = 200


def profile_runs_for(platform: str, asked: int | None) -> int:
    """How many warm runs to time per case: ``asked`` (bounded), else ``PROFILE_RUNS`` on a
    device and none in CPU emulation, whose times say nothing of a chip."""
    if asked is None:
        return PROFILE_RUNS if platform != "cpu" else 0
    return max(0, min(int(asked), MAX_PROFILE_RUNS))


def warm_median_s(
    call: Callable[[], Any], runs: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The median seconds of ``runs`` calls of ``call`` after one untimed warm-up call, each
    timed until its result is ready on the device."""
    import jax

    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs}")
    jax.block_until_ready(call())
    times = []
    for _ in range(runs):
        started = clock()
        jax.block_until_ready(call())
        times.append(clock() - started)
    return statistics.median(times)


def speedup(kernel_s: float | None, reference_s: float | None, times: str) -> float | None:
    """How many times faster the kernel is than the reference: only for times measured on a
    device (``times == "device"``), never for emulation's."""
    if times != "device" or not kernel_s or not reference_s or kernel_s <= 0:
        return None
    return reference_s / kernel_s
