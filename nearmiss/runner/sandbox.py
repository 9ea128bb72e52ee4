"""A sandbox child process seen from the engine: start, talk, watch, kill.

The child runs in its own session (so killing its process group takes anything it spawned), with
its own directory as cwd/HOME/TMPDIR, a scrubbed environment, stdout/stderr to a log file, and a
pair of pipes for messages. ``receive`` enforces deadlines and a resident-memory ceiling; whatever
the child does — hang, segfault, ``os._exit``, allocate without end — surfaces here as
``ChildTimeout`` or ``ChildDied``, never as a crash of the caller.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nearmiss.runner.child import ADDRESS_LIMIT_ENV, MEMORY_ENV
from nearmiss.runner.environment import child_environment, isolation_prefix
from nearmiss.runner.protocol import CHANNEL_ENV, LineReader, write_message

POLL_S = 0.05


@dataclass(frozen=True)
class Limits:
    """Resource limits for candidate code."""

    case_timeout_s: float = 60.0  # one case: trace + compile + run
    startup_timeout_s: float = 120.0  # interpreter, JAX and the candidate's import
    memory_mb: int = 4096


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


class SandboxChild:
    """One child process running ``python -m MODULE`` under the sandbox rules."""

    def __init__(
        self,
        module: str,
        home: Path,
        limits: Limits,
        platform_hint: str = "cpu",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.limits = limits
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / "child.log"
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()
        env = child_environment(home, extra=extra_env)
        env[CHANNEL_ENV] = f"{to_child_r},{from_child_w}"
        env[MEMORY_ENV] = str(limits.memory_mb)
        # XLA on CPU works under an address-space limit; CUDA reserves huge virtual ranges.
        env[ADDRESS_LIMIT_ENV] = "1" if platform_hint == "cpu" else "0"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*isolation_prefix(), sys.executable, "-m", module],
                cwd=home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(to_child_r, from_child_w),
                start_new_session=True,
            )
        os.close(to_child_r)
        os.close(from_child_w)
        self._reader = LineReader(self._from_child_r)
        self.peak_rss_mb = 0.0

    def send(self, **message: Any) -> None:
        try:
            write_message(self._to_child_w, message)
        except (BrokenPipeError, OSError) as exc:
            raise self._died() from exc

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next message, or ChildTimeout / ChildDied."""
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
            rss = resident_mb(self.process.pid)
            self.peak_rss_mb = max(self.peak_rss_mb, rss)
            if rss > self.limits.memory_mb:
                self.kill()
                raise ChildDied(
                    f"memory limit exceeded: resident {rss:.0f} MB > {self.limits.memory_mb} MB",
                    self.log_tail(),
                )

    def _died(self) -> ChildDied:
        self._wait_exited(timeout_s=5)
        self.kill()
        return ChildDied(f"process {describe_exit(self.process.returncode)}", self.log_tail())

    def _wait_exited(self, timeout_s: float) -> None:
        """Wait for the child to exit *without reaping it*, so its group id stays reserved."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return
            except ChildProcessError:
                return
            time.sleep(POLL_S)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        """Kill the child's whole process group (anything it spawned too), then reap it."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        """Ask the child to exit, then make sure it has, and release the pipes."""
        if self.process.returncode is None:
            with contextlib.suppress(OSError):
                write_message(self._to_child_w, {"cmd": "exit"})
            self._wait_exited(timeout_s=5)
        self.kill()
        for fd in (self._to_child_w, self._from_child_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> SandboxChild:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
