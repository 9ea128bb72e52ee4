"""Children started ahead of the checks that will use them, on a busy worker.

Every check starts fresh children, and each imports JAX before it can work (about 0.7 s here,
seconds of backend start-up on accelerator hosts). Two kinds hold nothing of a candidate when
they start, so a worker can start them between checks, while the fix step or the workflow runs,
and hand each to exactly one check:

- the executors (``executor_child``: the artifact runner and the target judge): empty homes, the
  candidate never imported there;
- the candidate child (``candidate_child``), started without a candidate: JAX imported, interpret
  mode forced, ``pallas_call`` labelling installed, and nothing else; the check copies its
  candidate into the child's home and names it in the first message, and the child imports it
  then, exactly as a fresh one does at start;
- the spec's child (``reference_child``), started with its work directory's ``spec/`` (empty
  until the check copies its spec in), ``cases/`` and the compile cache bound in
  (``runner.spec_sandbox``), and JAX imported.

Spares pay only where a core would otherwise wait: started while other checks keep every core
busy, their JAX imports slow those checks by as much as they save the next one (measured: ten
playbook repairs' checks in two lanes on two cores, 12 % slower with spares refilled after every
check). So a check that ends refills only when the checks still running in this process leave a
check's worth of cores free (``refill_after``): always on a worker with cores to spare, on two
cores only when no other check runs (a single repair, whose fix step the imports overlap).

Isolation is what it was for the children that hold a candidate's or a spec's code: one of each
per check, the same sandbox, limits and namespaces, each closed (and its home removed) when its
check ends; a spare is only started earlier.

The executor that runs a check's artifacts is kept for the next check on a CPU instead
(``give_back``): it never imports a candidate; it runs only exported artifacts that passed the
audit and ``artifact.vetted`` (no host callback, no custom call it does not vouch for), and on a
CPU such an artifact is plain XLA — it reads and writes its own buffers and nothing else of the
process. So an executor that ended a check cleanly (it answered every request; none timed out,
died, answered nonsense or breached a limit) holds nothing a later check could be told by: its
home is emptied, its log read from that point on, and ``reset`` makes it forget every artifact,
verdict and compiled program (and hand freed memory back) before it says ``ready`` again. Only
where nothing else ran in it: not after an artifact that calls native code (XLA's LAPACK or
FFT: vouched for to run, not plain XLA). The target judge, which gives the candidate's chip
artifacts to libtpu's compiler and reads its Triton modules (native parsers no audit vets
first), serves one check, as does every executor on an accelerator, where a kernel is the
candidate's own machine code (Triton, Mosaic) that can write anywhere in the device's memory.
A kept executor is retired once its log passes ``MAX_KEPT_LOG_BYTES``. One that is lost while
it waits costs the next check a fresh start, never a finding (``session._Executor``). This
saves a check the runs' executor's JAX start-up.

Off unless ``enable()`` is called or ``kept()`` entered (workers: ``nearmiss worker`` and the
worker a ``repair``/``fleet``/``demo`` command runs for itself; the benchmark): a one-shot
``nearmiss check`` would only start children nobody uses. ``keep_executors()`` keeps the
executors between checks without starting spares (a process that runs many checks in a row and
leaves the cores to them, as a test session does).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from pathlib import Path

from nearmiss.engine.errors import UsageError
from nearmiss.engine.runner.compile_cache import reference_cache_dir
from nearmiss.engine.runner.environment import UNSAFE_ENV, child_environment
from nearmiss.engine.runner.sandbox import ChildFailure, Limits, SandboxChild
from nearmiss.engine.runner.scratch import remove_tree, scratch_dir
from nearmiss.engine.runner.spec_sandbox import REFERENCE_MODULE, REFERENCE_PREFIX, start_spec_child

EXECUTOR_MODULE = "nearmiss.engine.runner.executor_child"
EXECUTOR_PREFIX = "nearmiss-executor-"
CANDIDATE_MODULE = "nearmiss.engine.runner.candidate_child"
CANDIDATE_PREFIX = "nearmiss-candidate-"
# What one check uses: two executors (the runs and the target judge), one candidate child and
# one spec's child.
DEPTH = {EXECUTOR_MODULE: 2, CANDIDATE_MODULE: 1, REFERENCE_MODULE: 1}
PREFIX = {EXECUTOR_MODULE: EXECUTOR_PREFIX, CANDIDATE_MODULE: CANDIDATE_PREFIX}

# A kept executor's log (its stderr, the engine reads the tail) grows with every check it serves:
# past this it is retired rather than kept.
MAX_KEPT_LOG_BYTES = 16 * 1024**2

# About how many cores one check keeps busy: the spec's child and the candidate's side by side.
CORES_PER_CHECK = 2

_lock = threading.Lock()
_spares: dict[tuple, list[SandboxChild]] = {}
_enabled = False
_keep_executors = False  # executors given back after a check even with spares off
_running = 0  # checks in flight in this process (between check_began and refill_after)


def enable() -> None:
    """Keep spare children from now on in this process (closed at exit)."""
    global _enabled
    with _lock:
        if not _enabled:
            _enabled = True
            atexit.register(close_all)


def keep_executors() -> None:
    """Keep healthy CPU executors between checks in this process (closed at exit)."""
    global _keep_executors
    with _lock:
        if not _keep_executors and not _enabled:
            atexit.register(close_all)
        _keep_executors = True


def disable() -> None:
    """Keep none from now on, and close those waiting."""
    global _enabled
    with _lock:
        _enabled = False
    close_all()


@contextlib.contextmanager
def kept():
    """Spares on while the block runs (a command's own worker), then off and closed, unless
    they were on before it."""
    was = _enabled
    enable()
    try:
        yield
    finally:
        if not was:
            disable()


def key(module: str, limits: Limits, platform: str) -> tuple:
    """What a child started now is started with (sandbox.SandboxChild): its module, memory and
    process limits, platform, whether it is sandboxed at all (``--unsafe-no-sandbox``), the
    variables it inherits (JAX_ENABLE_X64, XLA_FLAGS: set between two checks, they must reach
    the second) and (the spec's child) the compile cache bound in. The time limits are the
    engine's side and apply to whoever takes it."""
    cache = str(reference_cache_dir() or "")
    inherited = tuple(sorted(child_environment(Path("/")).items()))
    unsafe = os.environ.get(UNSAFE_ENV, "")
    return (module, limits.memory_mb, limits.max_tasks, platform, cache, unsafe, inherited)


def _start(module: str, limits: Limits, platform: str) -> SandboxChild:
    if module != REFERENCE_MODULE:
        return SandboxChild(module, scratch_dir(PREFIX[module]), limits, platform)
    workdir = scratch_dir(REFERENCE_PREFIX)
    try:
        return start_spec_child(workdir, limits, platform)
    except BaseException:
        remove_tree(workdir)
        raise


def root(child: SandboxChild) -> Path:
    """The directory that goes with a spare: its home, or the spec's child's work directory."""
    return child.home.parent if child.module == REFERENCE_MODULE else child.home


def take(module: str, limits: Limits, platform: str) -> SandboxChild | None:
    """A started child of ``module`` for these limits, handed out once; None when there is
    none."""
    found, dead = None, []
    with _lock:
        waiting = _spares.get(key(module, limits, platform), [])
        while waiting and found is None:
            child = waiting.pop(0)
            alive = child.process is not None and child.process.poll() is None
            if alive:
                found = child
            else:
                dead.append(child)
    for child in dead:  # died while waiting: never handed to a check
        _discard(child)
    return found


def give_back(child: SandboxChild, started_under: tuple, platform: str) -> bool:
    """Keep the runs' executor of a check that ended cleanly for the next check (see the
    module's docstring for why that is safe on a CPU), under the ``key`` it was started with:
    its home emptied, its log read from here on, asked to ``reset``. False where it is not kept
    (the caller closes it): not kept in this process, not a CPU, dead, its starting thread gone,
    a limit breached, its log grown past ``MAX_KEPT_LOG_BYTES``, or enough waiting."""
    if child.module != EXECUTOR_MODULE or platform != "cpu" or not (_enabled or _keep_executors):
        return False
    if child.process is None or child.process.poll() is not None:
        return False
    if not child.started_by.is_alive():  # --die-with-parent: it dies with that thread
        return False
    if child.group is not None and child.group.breaches():  # its counts only ever rise
        return False
    if child.log_size() > MAX_KEPT_LOG_BYTES:
        return False
    try:
        for entry in list(child.home.iterdir()):
            remove_tree(entry)
        if any(child.home.iterdir()):
            return False
        child.forget_log()
        child.send(cmd="reset")  # its "ready" is the first thing the next check reads
    except (OSError, ChildFailure):
        return False
    with _lock:
        waiting = _spares.setdefault(started_under, [])
        if not (_enabled or _keep_executors) or len(waiting) >= DEPTH[EXECUTOR_MODULE]:
            return False
        waiting.append(child)
    return True


def refill(limits: Limits, platform: str) -> None:
    """Start children until what one check uses waits for these limits (a check has just
    ended). A spare that cannot start is no failure of the check that ended: the next check
    starts its own."""
    if not _enabled:
        return
    with _lock:
        for module, depth in DEPTH.items():
            waiting = _spares.setdefault(key(module, limits, platform), [])
            while len(waiting) < depth:
                try:
                    waiting.append(_start(module, limits, platform))
                except (UsageError, OSError):
                    return


def check_began() -> None:
    """A check starts in this process (paired with ``refill_after`` when it ends)."""
    global _running
    with _lock:
        _running += 1


def cores() -> int:
    """The cores this process may run on (its affinity, where the platform says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def refill_after(limits: Limits, platform: str) -> None:
    """A check has ended: ``refill`` for the next one if the checks still running here leave a
    check's worth of cores free; otherwise the next check starts its own children."""
    global _running
    with _lock:
        _running -= 1
        others = _running
    if (others + 1) * CORES_PER_CHECK <= cores():
        refill(limits, platform)


def waiting_pids(module: str | None = None) -> list[int]:
    """The process ids of the spares now waiting (of ``module``'s only, if given), for tests."""
    with _lock:
        return [
            c.process.pid
            for key, cs in _spares.items()
            for c in cs
            if c.process is not None and module in (None, key[0])
        ]


def close_all() -> None:
    """Close every waiting spare and remove its home."""
    with _lock:
        children = [child for waiting in _spares.values() for child in waiting]
        _spares.clear()
    for child in children:
        _discard(child)


def _discard(child: SandboxChild) -> None:
    child.close()
    remove_tree(root(child))
