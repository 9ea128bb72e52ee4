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

Isolation is what it was for the child that holds a candidate's code: one per check, the same
sandbox, limits and namespaces, closed (and its home removed) when its check ends; a spare is
only started earlier. Where a candidate shows in its user's folder, or no spare waits, a worker
forks the candidate's child from a zygote instead (``runner.zygote``), which saves the JAX
import rather than moving it. The spec's child is kept for the next check of the same spec (below).

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

The spec's child of a check that ended cleanly (its every answer given, the last ``done``) is
kept too, on a CPU, for the next check of the same spec (``keep_spec``: the same bytes under the
same file name, the same limits and inherited variables): a repair, a fleet's kernels of one
operator and a test session check one spec again and again, each time on a new seed. It never
sees a candidate: it reads the spec and the engine's requests, and writes inputs and
references, which the engine reads (a candidate's influence on it is which control cases the
engine asks for, within the spec's domain, as in a fresh child). What it keeps is the spec's
module and JAX's compiled operations, which is the saving: its JAX start-up, the spec's import,
and the compiles of every operation the reference runs eagerly on shapes it has seen (measured:
1.5 to 2.5 CPU-seconds of a golden's check, most of what its spec's child costs). The spec is
the user's trusted code, but fallible: a spec that keeps state between calls (a counter, a
cache that changes its answers) could answer a kept child's later check differently from a
fresh child, which the spec contract already rules out (``make_inputs`` and ``reference`` are
functions of the case, the key and the inputs). Its ``cases/`` folder is emptied between
checks, everything else of the check's work directory removed. It is retired after
``MAX_SPEC_CHECKS`` checks, or once its resident memory passes ``MAX_SPEC_MEMORY_SHARE`` of its
limit, so its caches can never make a later check's spec fail a limit a fresh child would have
kept to. At most ``MAX_KEPT_SPECS`` wait in a process (the least recently kept goes first).

Off unless ``enable()`` is called or ``kept()`` entered (workers: ``nearmiss worker`` and the
worker a ``repair``/``fleet``/``demo`` command runs for itself; the benchmark): a one-shot
``nearmiss check`` would only start children nobody uses. ``keep_warm()`` keeps the executors
and spec's children between checks without starting spares (a process that runs many checks in
a row and leaves the cores to them, as a test session does).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from nearmiss.engine.errors import UsageError
from nearmiss.engine.runner import cgroups
from nearmiss.engine.runner.compile_cache import reference_cache_dir
from nearmiss.engine.runner.environment import UNSAFE_ENV, child_environment, unsafe_requested
from nearmiss.engine.runner.sandbox import ChildFailure, Limits, SandboxChild, resident_mb
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
# Kept spec's children (``keep_spec``): how many wait in a process, how many checks each serves.
MAX_KEPT_SPECS = 4
MAX_SPEC_CHECKS = 64
MAX_SPEC_MEMORY_SHARE = 0.5  # of its memory limit, resident, past which it is not kept

# About how many cores one check keeps busy: the spec's child and the candidate's side by side.
CORES_PER_CHECK = 2

_lock = threading.Lock()
_spares: dict[tuple, list[SandboxChild]] = {}
_enabled = False
_keep_warm = False  # executors and spec's children kept after a check even with spares off
_spec_checks: dict[int, int] = {}  # a kept spec's child's pid -> the checks it has served
_kept_specs: list[SandboxChild] = []  # kept spec's children waiting, least recently kept first
_also_closed: list[Callable[[], None]] = []  # ``also_close``
_running = 0  # checks in flight in this process (between check_began and refill_after)


def enable() -> None:
    """Keep spare children from now on in this process (closed at exit)."""
    global _enabled
    with _lock:
        if not _enabled:
            _enabled = True
            atexit.register(close_all)


def keep_warm() -> None:
    """Keep healthy CPU executors and spec's children between checks in this process (closed
    at exit)."""
    global _keep_warm
    with _lock:
        if not _keep_warm and not _enabled:
            atexit.register(close_all)
        _keep_warm = True


def keeping() -> bool:
    """Whether this process keeps children between checks (``enable``, ``keep_warm``)."""
    return _enabled or _keep_warm


def forks_candidates(platform: str) -> bool:
    """Whether candidate's children are forked from a zygote here (``runner.zygote``) instead
    of started: in a process that keeps children, on a CPU, in the sandbox, with cgroups."""
    return (
        keeping() and platform == "cpu" and not unsafe_requested()
        and cgroups.available() is None
    )  # fmt: skip


def spare_depth(module: str, platform: str) -> int:
    """How many of ``module``'s children ``refill`` keeps waiting: what one check uses, but no
    candidate's child where those are forked when a check asks (``forks_candidates``: there is
    no import to move ahead)."""
    if module == CANDIDATE_MODULE and forks_candidates(platform):
        return 0
    return DEPTH[module]


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


def spec_identity(text: bytes | None, name: str) -> tuple:
    """What a kept spec's child is kept for (``keep_spec``): its spec's bytes and file name;
    () for a spec that could not be read (never kept)."""
    return () if text is None else (hashlib.sha256(text).hexdigest(), name)


def take(module: str, limits: Limits, platform: str, spec: tuple = ()) -> SandboxChild | None:
    """A started child of ``module`` for these limits, handed out once; None when there is
    none. ``spec`` (``spec_identity``): a spec's child kept with that spec loaded."""
    found, dead = None, []
    with _lock:
        waiting = _spares.get(key(module, limits, platform) + spec, [])
        while waiting and found is None:
            child = waiting.pop(0)
            if child in _kept_specs:
                _kept_specs.remove(child)
            alive = child.process is not None and child.process.poll() is None
            if alive:
                found = child
            else:
                dead.append(child)
    for child in dead:  # died while waiting: never handed to a check
        _discard(child)
    return found


def _fit_to_keep(child: SandboxChild) -> bool:
    """What every kept child must be: kept in this process at all, alive, its starting thread
    alive, no limit breached, its log below ``MAX_KEPT_LOG_BYTES``."""
    if not keeping():
        return False
    if child.process is None or child.process.poll() is not None:
        return False
    if not child.started_by.is_alive():  # --die-with-parent: it dies with that thread
        return False
    if child.group is not None and child.group.breaches():  # its counts only ever rise
        return False
    return child.log_size() <= MAX_KEPT_LOG_BYTES


def give_back(child: SandboxChild, started_under: tuple, platform: str) -> bool:
    """Keep the runs' executor of a check that ended cleanly for the next check (see the
    module's docstring for why that is safe on a CPU), under the ``key`` it was started with:
    its home emptied, its log read from here on, asked to ``reset``. False where it is not kept
    (the caller closes it): not kept in this process, not a CPU, dead, its starting thread gone,
    a limit breached, its log grown past ``MAX_KEPT_LOG_BYTES``, or enough waiting."""
    if child.module != EXECUTOR_MODULE or platform != "cpu" or not _fit_to_keep(child):
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
        if not keeping() or len(waiting) >= DEPTH[EXECUTOR_MODULE]:
            return False
        waiting.append(child)
    return True


def keep_spec(child: SandboxChild, started_under: tuple, platform: str, spec: tuple) -> bool:
    """Keep the spec's child of a check that ended cleanly for the next check of the same
    ``spec`` (``spec_identity``; see the module's docstring for why that is safe): its work
    directory emptied but for the spec and its home, its log read from here on. False where it
    is not kept (the caller closes it and removes its work directory): not kept in this process,
    not a CPU, an unreadable spec, dead, its starting thread gone, a limit breached or half its
    memory used, its log grown past ``MAX_KEPT_LOG_BYTES``, its checks served."""
    if child.module != REFERENCE_MODULE or platform != "cpu" or not spec:
        return False
    if not _fit_to_keep(child):
        return False
    assert child.process is not None  # alive, said _fit_to_keep
    pid = child.process.pid
    served = _spec_checks.get(pid, 0) + 1
    if served >= MAX_SPEC_CHECKS:
        return False
    if resident_mb(pid) > child.limits.memory_mb * MAX_SPEC_MEMORY_SHARE:
        return False
    workdir = root(child)
    try:
        for entry in list(workdir.iterdir()):
            if entry.name == "cases":  # bound into the child: emptied, never replaced
                for case in list(entry.iterdir()):
                    remove_tree(case)
            elif entry.name not in ("spec", "home"):
                remove_tree(entry)
        if any((workdir / "cases").iterdir()):
            return False
    except OSError:
        return False
    child.forget_log()
    where = started_under + spec
    evicted = []
    with _lock:
        waiting = _spares.setdefault(where, [])
        if not keeping() or len(waiting) >= DEPTH[REFERENCE_MODULE] + 1:
            return False
        waiting.append(child)
        _spec_checks[pid] = served
        _kept_specs.append(child)
        while len(_kept_specs) > MAX_KEPT_SPECS:
            oldest = _kept_specs.pop(0)
            for children in _spares.values():
                if oldest in children:
                    children.remove(oldest)
            evicted.append(oldest)
    for old in evicted:
        _discard(old)
    return True


def refill(limits: Limits, platform: str) -> None:
    """Start children until what one check uses waits for these limits (a check has just
    ended). A spare that cannot start is no failure of the check that ended: the next check
    starts its own."""
    if not _enabled:
        return
    with _lock:
        for module in DEPTH:
            depth = spare_depth(module, platform)
            base = key(module, limits, platform)
            waiting = _spares.setdefault(base, [])
            # A spec's child kept with its spec loaded stands for the spare (``keep_spec``).
            kept = sum(
                len(c) for k, c in _spares.items() if len(k) > len(base) and k[: len(base)] == base
            )
            while len(waiting) + kept < depth:
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
        _kept_specs.clear()
    for child in children:
        _discard(child)
    for close in _also_closed:
        close()


def also_close(close: Callable[[], None]) -> None:
    """Have ``close_all`` call ``close`` too: for what other modules keep between checks on the
    same terms (``runner.zygote``), which this module does not import."""
    if close not in _also_closed:
        _also_closed.append(close)


def _discard(child: SandboxChild) -> None:
    if child.process is not None:
        _spec_checks.pop(child.process.pid, None)
    child.close()
    remove_tree(root(child))
