"""Executor children started ahead of the checks that will use them, on a busy worker.

Every check starts fresh children, and each imports JAX before it can work (about 0.7 s here,
seconds of backend start-up on accelerator hosts). The executors (``executor_child``: the
artifact runner and the target judge) hold nothing of a candidate when they start — their homes
are empty and the candidate is never imported there — so a worker can start them between checks,
while the fix step or the workflow runs, and hand each to exactly one check. Isolation is what
it was: one pair of executors per check, the same sandbox, limits and namespaces, each closed
(and its home removed) when its check ends; a spare is only started earlier.

Off unless ``enable()`` is called (long-lived workers, the benchmark): a one-shot
``nearmiss check`` would only start children nobody uses.
"""

from __future__ import annotations

import atexit
import shutil
import threading

from nearmiss.errors import UsageError
from nearmiss.runner.sandbox import Limits, SandboxChild
from nearmiss.runner.scratch import scratch_dir

EXECUTOR_MODULE = "nearmiss.runner.executor_child"
EXECUTOR_PREFIX = "nearmiss-executor-"
# A check uses two executors (the runs and the target judge).
DEPTH = 2

_lock = threading.Lock()
_spares: dict[tuple[int, str], list[SandboxChild]] = {}
_enabled = False


def enable() -> None:
    """Keep spare executors from now on in this process (closed at exit)."""
    global _enabled
    with _lock:
        if not _enabled:
            _enabled = True
            atexit.register(close_all)


def disable() -> None:
    """Keep none from now on, and close those waiting."""
    global _enabled
    with _lock:
        _enabled = False
    close_all()


def _key(limits: Limits, platform: str) -> tuple[int, str]:
    # What a child is started with (sandbox.SandboxChild): its memory limit and platform; the
    # time limits are the engine's side and apply to whoever takes it.
    return (limits.memory_mb, platform)


def take(limits: Limits, platform: str) -> SandboxChild | None:
    """A started executor for these limits, handed out once; None when there is none."""
    with _lock:
        waiting = _spares.get(_key(limits, platform), [])
        while waiting:
            child = waiting.pop(0)
            if child.process is not None and child.process.poll() is None:
                return child
            _discard(child)  # died while waiting: never handed to a check
    return None


def refill(limits: Limits, platform: str) -> None:
    """Start executors until ``DEPTH`` wait for these limits (a check has just ended). A spare
    that cannot start is no failure of the check that ended: the next check starts its own."""
    if not _enabled:
        return
    with _lock:
        waiting = _spares.setdefault(_key(limits, platform), [])
        while len(waiting) < DEPTH:
            try:
                home = scratch_dir(EXECUTOR_PREFIX)
                waiting.append(SandboxChild(EXECUTOR_MODULE, home, limits, platform))
            except (UsageError, OSError):
                return


def waiting_pids() -> list[int]:
    """The process ids of the spares now waiting (for tests and the benchmark)."""
    with _lock:
        return [c.process.pid for cs in _spares.values() for c in cs if c.process is not None]


def close_all() -> None:
    """Close every waiting spare and remove its home."""
    with _lock:
        children = [child for waiting in _spares.values() for child in waiting]
        _spares.clear()
    for child in children:
        _discard(child)


def _discard(child: SandboxChild) -> None:
    child.close()
    shutil.rmtree(child.home, ignore_errors=True)
