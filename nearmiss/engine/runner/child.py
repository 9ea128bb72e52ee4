"""Start-up shared by the sandbox children (runs inside the child, before any spec or candidate).

A child limits itself first thing, while only engine code has run: address space (on CPU, where
XLA tolerates it), file size, core dumps. The engine also watches the child's resident memory
from outside, which covers accelerator platforms and a candidate that raises its own limits.
"""

from __future__ import annotations

import os
import resource
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
    return Channel()
