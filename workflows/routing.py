"""Which Temporal task queue each activity goes to: one general queue, one queue per target.

Check-like activities (a check, the agent's experiments) run candidate code, and must run on a
worker that serves the session's target: a TPU target needs libtpu's compile-only toolchain, a
GPU target a GPU. So each target has its own queue (``nearmiss-check-tpu-v5e``), polled only by
workers that serve it (``nearmiss worker --targets``); everything else (the workflows, model
calls, recording, retrieval, learning) goes to the general queue any worker polls.

A session with several targets goes to the queue of its most demanding one: ``gpu`` before a TPU
generation (the first named) before ``interpret``; the worker that takes the check must serve
the others too, and refuses it (``TargetNotServed``) when it does not. A check no worker takes
within the session's ``worker_wait_s`` stops the session with ``no_worker`` rather than waiting
forever (``schedule_to_start_timeout``, which Temporal does not retry).

The short general activities a workflow waits on between its steps (recording its events,
retrieval, learning: reads and writes of the event store) run as *local* activities
(``run_here``): the worker running the workflow runs them at once, inside the same workflow
task, instead of the server scheduling and dispatching them and starting a new workflow task
when they complete. That saves two server round trips per step (benchmarks/fleet_overhead.py).
Their results are kept in the history as markers, so a replay runs none of them again.

No I/O: the workflows import this.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from workflows.patches import CHECK_QUEUES, LOCAL_ACTIVITIES, has

GENERAL_QUEUE = "nearmiss-repair"
CHECK_QUEUE_PREFIX = "nearmiss-check-"
# The target names as nearmiss.engine.targets.registry spells them, restated: workflows import
# nothing
# from the engine's packages.
INTERPRET, GPU = "interpret", "gpu"
NOT_SERVED = "TargetNotServed"  # the error type a worker raises for a target it does not serve


def routing_target(targets: Sequence[str]) -> str:
    """The target whose workers must take a check of these targets (empty: ``interpret``)."""
    if GPU in targets:
        return GPU
    return next((t for t in targets if t.startswith("tpu-")), INTERPRET)


def check_queue(targets: Sequence[str]) -> str:
    return queue_of(routing_target(targets))


def queue_of(target: str) -> str:
    return CHECK_QUEUE_PREFIX + target


def check_options(options: dict, targets: Sequence[str], worker_wait_s: float) -> dict:
    """``options`` sent to the targets' queue, waiting at most ``worker_wait_s`` for a worker;
    unchanged for a session that started before target queues (its history has none)."""
    if not has(CHECK_QUEUES):
        return options
    return {
        **options,
        "task_queue": check_queue(targets),
        "schedule_to_start_timeout": timedelta(seconds=worker_wait_s),
    }


async def run_here(name: str, arg: object, **options: Any) -> Any:
    """Run the general activity ``name`` on ``arg`` as a local activity (see above); scheduled
    on the general queue for a session that started before local activities."""
    if has(LOCAL_ACTIVITIES):
        return await workflow.execute_local_activity(name, arg, **options)
    return await workflow.execute_activity(name, arg, **options)


def no_worker_reason(
    err: ActivityError, targets: Sequence[str], worker_wait_s: float
) -> str | None:
    """Why a check-like activity failed for want of a worker of its target, in words; None
    when it failed for another reason."""
    cause = err.cause
    target = routing_target(targets)
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
        return (
            f"no worker serves target {target}: nothing polled task queue {queue_of(target)} "
            f"for {worker_wait_s:g} s (start one with `nearmiss worker --targets {target}`)"
        )
    if isinstance(cause, ApplicationError) and cause.type == NOT_SERVED:
        return str(cause.message)
    return None
