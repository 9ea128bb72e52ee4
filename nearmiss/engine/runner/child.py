"""Start-up shared by the sandbox children (runs inside the child, before any spec or candidate).

A child limits itself first thing, while only engine code has run: address space (on CPU, where
XLA tolerates it), file size, core dumps. The engine also holds the child to its memory limit
from outside (its cgroup, or else a watch of its resident memory: ``sandbox``), which covers
accelerator platforms and a candidate that raises its own limits.

Then it makes sure an engine is still there to watch it. bwrap binds the sandbox's lifetime to
the engine's (``--die-with-parent``) only once it has set the sandbox up, a few milliseconds
after it starts; an engine killed in that window (a worker's SIGKILL, the OOM killer) left a
sandbox that went on to import its candidate and run it with no deadline and no memory watch,
for ever (measured: every time, for an engine that exits right after starting a child). The
engine holds the only writing end of the child's message pipe, so the pipe reports a hang-up
exactly when the engine is gone; a child that sees one exits before any spec or candidate code
runs. An engine still alive here means both bwraps are already bound to it: each arms its
parent-death signal before the next process starts, and this interpreter is the last one.
"""

from __future__ import annotations

import os
import resource
import select
import traceback
from typing import Any

from nearmiss.engine.runner.protocol import CHANNEL_ENV, LineReader, write_message

MEMORY_ENV = "NEARMISS_MEMORY_MB"
ADDRESS_LIMIT_ENV = "NEARMISS_LIMIT_ADDRESS_SPACE"
MAX_OUTPUT_FILE = 2 * 1024**3


class Channel:
    """The child's end of the engine channel."""

    def __init__(self) -> None:
        read_fd, write_fd = (int(fd) for fd in os.environ[CHANNEL_ENV].split(","))
        self.reader = LineReader(read_fd)
        self.write_fd = write_fd

    def send(self, **message: Any) -> None:
        write_message(self.write_fd, message)

    def receive(self) -> dict[str, Any]:
        return self.reader.read_blocking()

    def engine_gone(self) -> bool:
        """Whether every writing end of the engine's pipe is closed: the engine has exited."""
        poller = select.poll()
        poller.register(self.reader.fd, select.POLLIN)  # a hang-up is reported regardless
        return any(events & select.POLLHUP for _, events in poller.poll(0))


def apply_limits() -> None:
    memory_mb = int(os.environ.get(MEMORY_ENV, "0"))
    if memory_mb > 0 and os.environ.get(ADDRESS_LIMIT_ENV) == "1":
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_FILE, MAX_OUTPUT_FILE))


def _unsaid(exc: BaseException) -> str:
    """What an exception raised without a message still knows (JAX's ``custom_vjp`` raises a
    bare ``AttributeError()`` for a missing attribute, with ``name`` and ``obj`` set)."""
    name = getattr(exc, "name", None)
    if isinstance(exc, AttributeError) and isinstance(name, str):
        owner = type(getattr(exc, "obj", None)).__name__
        return f"'{owner}' object has no attribute '{name}'"
    return "(raised without a message)"


def describe_exception(exc: BaseException, phase: str) -> dict[str, Any]:
    """A JSON-able account of an exception: type, message and the traceback's frames."""
    frames = [
        {"file": f.filename, "line": f.lineno, "name": f.name, "code": f.line or ""}
        for f in traceback.extract_tb(exc.__traceback__)
    ]
    info: dict[str, Any] = {
        "phase": phase,
        "type": type(exc).__name__,
        "message": str(exc) or _unsaid(exc),
        "frames": frames,
    }
    if isinstance(exc, SyntaxError):
        info["syntax"] = {"file": exc.filename, "line": exc.lineno, "text": (exc.text or "")}
    return info


def start_child() -> Channel:
    apply_limits()
    channel = Channel()
    if channel.engine_gone():
        os._exit(0)  # nobody would watch, stop or read this child: see the module's docstring
    return channel


def freeze_imports() -> None:
    """Leave what the child has imported so far out of the garbage collector's passes
    (``gc.freeze``): JAX's modules are hundreds of thousands of objects, none of them garbage,
    that every full collection would walk again. Only in the engine's own children (the
    executor, the spec's child): a candidate's child is left as a plain process is."""
    import gc

    gc.freeze()
