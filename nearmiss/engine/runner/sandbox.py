"""A sandbox child process seen from the engine: start, talk, watch, kill.

The child runs under bubblewrap (see ``environment``) in its own session, with its own directory
as cwd/HOME/TMPDIR, a scrubbed environment, stdout/stderr to a log file, and a pair of pipes for
messages. Killing the process group kills bwrap, and with it (``--die-with-parent``, PID
namespace) everything inside the sandbox. Where the engine may make cgroups (``cgroups``), each
child runs in its own: the kernel holds it to its memory and process limits, and a kill empties
the group. ``receive`` enforces deadlines and reports the kernel's enforcements; without
cgroups it watches resident memory over bwrap's whole process tree instead. Whatever the
child does — hang, segfault, ``os._exit``, allocate or fork without end — surfaces here as
``ChildTimeout`` or ``ChildDied``, never as a crash of the caller.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearmiss.engine.errors import UsageError
from nearmiss.engine.runner import cgroups
from nearmiss.engine.runner.child import ADDRESS_LIMIT_ENV, MEMORY_ENV
from nearmiss.engine.runner.environment import (
    ENGINE_MOUNT,
    PROJECT_ROOT,
    PYTHON,
    Bubblewrap,
    can_show_at,
    child_environment,
    sandbox_for,
    seccomp_memfd,
)
from nearmiss.engine.runner.protocol import CHANNEL_ENV, LineReader, write_message
from nearmiss.engine.runner.scratch import remove_tree

POLL_S = 0.05
LOG_TAIL_BYTES = 256 * 1024  # enough for the last lines a failure quotes
# Children that run only engine and spec code; every other module runs candidate code and is
# refused where no sandbox can start (unless the user opted out).
TRUSTED_MODULES = frozenset({"nearmiss.engine.runner.reference_child"})
# Children that import a candidate's file. The file is put in CODE_FOLDER of the child's home,
# which is the child's working directory and, in the sandbox, shows where its user keeps it
# (else at CODE_MOUNT): what the candidate sees of its own path (``__file__``) and of its
# process names nothing of the engine (``runner.plain_import``). Nor do they get a fixed hash
# seed: ``hash("x")`` is a constant under one, and a plain Python draws a new seed each start.
CODE_MODULES = frozenset(
    {
        "nearmiss.engine.runner.candidate_child",
        "nearmiss.engine.runner.zygote_child",
        "nearmiss.engine.runner.probe_child",
        "nearmiss.engine.runner.lower_child",
    }
)
CODE_FOLDER = "code"
# Where the folder shows: the user's own folder, where the sandbox can show it there
# (``environment.can_show_at``), so ``__file__`` is what a plain import of the file gives; else
# (a spare started before its candidate is known, the knowledge base's checkouts) this one.
CODE_MOUNT = Path("/home/user")


@dataclass(frozen=True)
class Limits:
    """Resource limits for candidate code (and for the spec's child, which runs a user's spec).

    ``case_timeout_s`` (``--timeout``) bounds everything a child does on the code's behalf: one
    case's trace, compile and run; the candidate's import; the spec's work on one case. Starting
    an interpreter and JAX is the engine's own cost, allowed ``startup_allowance_s`` on top.
    """

    case_timeout_s: float = 60.0
    startup_timeout_s: float | None = None  # the candidate's import; default: derived as above
    memory_mb: int = 4096
    startup_allowance_s: float = 30.0
    # Processes and threads in one child's cgroup (only where cgroups are available: see
    # ``cgroups``): a fork bomb stops here. XLA sizes its thread pools by the cores it sees, a
    # few threads per core, so the default grows with them.
    max_tasks: int = field(default_factory=lambda: max(1024, 16 * (os.cpu_count() or 1)))

    @property
    def import_timeout_s(self) -> float:
        if self.startup_timeout_s is not None:
            return self.startup_timeout_s
        return self.case_timeout_s + self.startup_allowance_s

    @property
    def code_import_timeout_s(self) -> float:
        """An edit's import in the search's screening child, which has started already (its
        interpreter and JAX loaded, ``ready`` said): no allowance for the engine's own start-up,
        which is behind it. ``startup_timeout_s`` where given (it bounds start-up and import
        together, so it is never shorter than the import alone needs), else ``case_timeout_s``."""
        if self.startup_timeout_s is not None:
            return self.startup_timeout_s
        return self.case_timeout_s

    @property
    def reference_timeout_s(self) -> float:
        """How long the spec's child may take for one message (the first includes start-up)."""
        return self.case_timeout_s + self.startup_allowance_s


class ChildFailure(Exception):
    """Base of the ways a child can stop answering."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class ChildTimeout(ChildFailure):
    pass


class ChildDied(ChildFailure):
    pass


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


def _process_tree(pid: int) -> list[int]:
    """pid and all its descendants (the namespace launcher's child runs the actual Python)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending.extend(int(c) for c in children.read().split())
        except OSError:
            continue
    return found


def _running(pid: int) -> bool:
    """Whether pid is a live process (not gone, not a zombie awaiting its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.005)


def resident_mb(pid: int) -> float:
    """Resident memory of a process and its descendants, in MB."""
    total = 0
    for member in _process_tree(pid):
        try:
            with open(f"/proc/{member}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return total / 1024


def _group_for(limits: Limits) -> cgroups.ChildGroup | None:
    """The child's cgroup, where the engine makes them. Where it does and this one cannot be
    made, the child does not run: its report would say the kernel held it to its limits."""
    if cgroups.available() is not None:
        return None
    try:
        return cgroups.ChildGroup.create(limits.memory_mb, limits.max_tasks)
    except OSError as exc:
        raise UsageError(f"the cgroup for a sandbox child could not be made: {exc}") from exc


class SandboxChild:
    """One child process running ``python -m MODULE`` under the sandbox rules."""

    home_writable = True  # whether the sandbox may write its home (``writable`` folders aside)

    def __init__(
        self,
        module: str,
        home: Path,
        limits: Limits,
        platform_hint: str = "cpu",
        extra_env: dict[str, str] | None = None,
        read_only: tuple[Path, ...] = (),
        writable: tuple[Path, ...] = (),
        shows_code_at: Path | None = None,
    ) -> None:
        """Start the child now. Besides its own ``home`` (writable) it sees the host paths
        ``read_only`` and ``writable`` at the same place, and nothing else of the host's files
        but the system, the interpreter and the engine package. A child that imports a
        candidate sees its code folder at ``shows_code_at`` where it can (``CODE_MODULES``)."""
        self.limits = limits
        self.home = home
        self.module = module
        self.platform_hint = platform_hint
        self.extra_env = extra_env
        try:
            self.sandbox: Bubblewrap | None = sandbox_for(trusted=module in TRUSTED_MODULES)
            self.group = _group_for(limits)
        except UsageError:
            # The home is this child's own; a refused child leaves nothing behind.
            remove_tree(home)
            raise
        home.mkdir(parents=True, exist_ok=True)
        # Where a candidate's file goes (``CODE_MODULES``); None for the other children.
        self.code_dir = home / CODE_FOLDER if module in CODE_MODULES else None
        if self.code_dir is not None:
            self.code_dir.mkdir(exist_ok=True)
        self.code_shown_at = CODE_MOUNT
        wanted = shows_code_at
        if wanted is not None and can_show_at(wanted, (home, *read_only, *writable)):
            self.code_shown_at = wanted
        self.log_path = home / "child.log"
        # Read through the descriptor the child writes to, never the path again: the path is in
        # a directory the child can write, and a link put there would have the engine read any
        # host file (its own /proc/self/environ) into the diagnosis.
        self._log_fd: int | None = None
        self._log_from = 0  # where this child's current work starts in its log (``forget_log``)
        to_child_r, self._to_child_w = self._message_pipe()
        self._from_child_r, from_child_w = os.pipe()
        self._child_ends = [to_child_r, from_child_w]  # closed here once the child has them
        self._reader = LineReader(self._from_child_r)
        self._closed = False
        self.process: subprocess.Popen | None = None
        # bubblewrap's --die-with-parent kills the child when this thread ends, not the process.
        self.started_by = threading.current_thread()
        self._start(read_only, writable)

    def _message_pipe(self) -> tuple[int, int]:
        """The engine-to-child channel: (the child's reading end, the engine's writing end)."""
        return os.pipe()

    def _start(self, read_only: tuple[Path, ...], writable: tuple[Path, ...]) -> None:
        engine = PROJECT_ROOT if self.sandbox is None else ENGINE_MOUNT
        env = child_environment(self.home, extra=self.extra_env, engine_path=engine)
        env[CHANNEL_ENV] = ",".join(map(str, self._child_ends))
        env[MEMORY_ENV] = str(self.limits.memory_mb)
        # Without a cgroup, an address-space limit stands in for one on CPU (CUDA reserves huge
        # virtual ranges). A group counts the memory itself: an address-space limit there only
        # counts what XLA reserves (threads' stacks, arenas) and aborted even the spec's child
        # of a golden below about 2 GB.
        address_limit = self.platform_hint == "cpu" and self.group is None
        env[ADDRESS_LIMIT_ENV] = "1" if address_limit else "0"
        if self.platform_hint == "cpu":
            # Only the CPU backend: JAX would otherwise also start every accelerator plugin it
            # finds (libtpu, installed for compile-only TPU targets, aborts in the sandbox and
            # costs half a second where it does not).
            env.setdefault("JAX_PLATFORMS", "cpu")
        else:  # that device only: without it JAX would fall back to the CPU, silently
            env["JAX_PLATFORMS"] = self.platform_hint
        argv = [PYTHON, "-m", self.module]
        pass_fds = list(self._child_ends)
        seccomp_fd = None
        workdir = self.home
        mounts: tuple[tuple[Path, Path], ...] = ()
        if self.code_dir is not None:
            env.pop("PYTHONHASHSEED", None)
            workdir = self.code_dir
            if self.sandbox is not None:
                workdir, mounts = self.code_shown_at, ((self.code_dir, self.code_shown_at),)
                env.update(HOME=str(workdir), TMPDIR=str(workdir))
        if self.sandbox is not None:
            if self.sandbox.seccomp:
                seccomp_fd = seccomp_memfd(self.sandbox.seccomp)
                pass_fds.append(seccomp_fd)
            argv = self.sandbox.command(
                argv,
                self.home,
                env,
                read_only=read_only,
                writable=writable,
                devices=self.platform_hint != "cpu",
                seccomp_fd=seccomp_fd,
                mounts=mounts,
                workdir=workdir,
                home_writable=self.home_writable,
            )
        if self.group is not None:
            argv = self.group.command(argv)
        try:
            self._log_fd = os.open(
                self.log_path,
                os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            self.process = subprocess.Popen(
                argv,
                cwd=self.home if self.sandbox is not None else workdir,
                env=env,  # bwrap's own environment too: /proc/1/environ in the sandbox
                stdin=subprocess.DEVNULL,
                stdout=self._log_fd,
                stderr=subprocess.STDOUT,
                pass_fds=pass_fds,
                start_new_session=True,
            )
        finally:
            self._close_child_ends()
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def _close_child_ends(self) -> None:
        while self._child_ends:
            os.close(self._child_ends.pop())

    def send(self, **message: Any) -> None:
        try:
            write_message(self._to_child_w, message)
        except (BrokenPipeError, OSError) as exc:
            raise self._died() from exc

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next message, or ChildTimeout / ChildDied."""
        assert self.process is not None  # started in __init__, or __init__ raised
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = self._reader.pending()
            except ValueError as exc:  # includes JSONDecodeError
                self.kill()
                raise ChildDied(f"sent a malformed message ({exc})", self.log_tail()) from exc
            if message is not None:
                if not isinstance(message, dict) or not isinstance(message.get("event"), str):
                    self.kill()
                    raise ChildDied("sent a message without an event", self.log_tail())
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise ChildTimeout(f"no answer within {timeout_s:.0f} s", self.log_tail())
            ready, _, _ = select.select([self._from_child_r], [], [], min(remaining, POLL_S))
            try:
                if ready and not self._reader.feed():
                    raise self._died()
            except ValueError as exc:  # an oversized message
                self.kill()
                raise ChildDied(str(exc), self.log_tail()) from exc
            if self.group is not None:  # the kernel's count: exact, and enforced already
                breaches = self.group.breaches()
                if breaches:
                    self.kill()
                    raise ChildDied("; ".join(breaches), self.log_tail())
                continue
            # Without a group, the engine's own watch: it counts pages a fork shares twice,
            # and sees only what is mapped, only now.
            rss = resident_mb(self.process.pid)
            if rss > self.limits.memory_mb:
                self.kill()
                raise ChildDied(
                    f"memory limit exceeded: resident {rss:.0f} MB > {self.limits.memory_mb} MB",
                    self.log_tail(),
                )

    def _died(self) -> ChildDied:
        self._wait_exited(timeout_s=5)
        self.kill()
        breaches = self.group.breaches() if self.group is not None else []
        if breaches:  # the kernel killed it at a limit: say which
            return ChildDied("; ".join(breaches), self.log_tail())
        code = self.process.returncode if self.process is not None else -9
        if self.sandbox is not None and 128 < code < 128 + signal.NSIG:
            code = 128 - code  # bwrap reports a child killed by signal N as status 128 + N
        return ChildDied(f"process {describe_exit(code)}", self.log_tail())

    def _wait_exited(self, timeout_s: float) -> None:
        """Wait for the child to exit *without reaping it*, so its group id stays reserved."""
        deadline = time.monotonic() + timeout_s
        while self.process is not None and time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return
            except ChildProcessError:
                return
            time.sleep(POLL_S)

    def log_size(self) -> int:
        try:
            return os.fstat(self._log_fd).st_size if self._log_fd is not None else 0
        except OSError:
            return 0

    def forget_log(self) -> None:
        """From now on, log tails start here: a child kept for another check
        (``spares.give_back``) must not show the last check's lines in the next one's report."""
        self._log_from = self.log_size()

    def log_tail(self, lines: int = 60) -> str:
        if self._log_fd is None:
            return ""
        try:
            size = os.fstat(self._log_fd).st_size
            start = max(self._log_from, size - LOG_TAIL_BYTES)
            text = os.pread(self._log_fd, size - start, start).decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        """Kill the child's process tree and group (anything it spawned too), then reap it."""
        if self.process is not None and self.process.returncode is None:
            # Inside bwrap the child has a session of its own: kill the whole tree, not only
            # the group, and wait until the sandboxed processes are gone, not merely doomed.
            tree = _process_tree(self.process.pid)
            for pid in tree[1:]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            _wait_gone(tree[1:], timeout_s=5)
        if self.group is not None:  # what left the tree (a double fork, a sandbox's init)
            self.group.kill()

    def close(self) -> None:
        """Ask the child to exit, then make sure it has, and release the pipes. Once: a second
        call would close descriptor numbers that another child may have been given since."""
        if self._closed:
            return
        self._closed = True
        self._close_child_ends()  # still here when the child never started
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(OSError):
                write_message(self._to_child_w, {"cmd": "exit"})
            self._wait_exited(timeout_s=5)
        self.kill()
        for fd in (self._to_child_w, self._from_child_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if self.group is not None:
            self.group.remove()

    def __enter__(self) -> SandboxChild:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
