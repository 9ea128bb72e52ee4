"""Errors every layer shares: a usage error is the user's input, never a finding or a crash;
and the line of a dead child's log that says what killed it."""

from __future__ import annotations


class UsageError(Exception):
    """The inputs are unusable (bad spec, no kernel...): a one-line reason, exit status 2."""


class Stopped(Exception):
    """A command was stopped by a signal; what it started has been stopped
    (``nearmiss.client.service.stop_on_signals``). Its exit status is ``128 + signum``, as a
    shell reports a process the signal killed."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


# What Python writes above a traceback; a runtime that re-raises a callback's exception (JAX's
# io_callback, as TPU interpret mode uses) carries that whole text in its own message.
TRACEBACK_HEADER = "Traceback (most recent call last)"
# JAX prints this after the error itself when it filters its frames out of a traceback.
JAX_FILTER_NOTE = "For simplicity, JAX has removed its internal frames"


def last_error_line(log: str) -> str:
    """The log's last line that says something: not JAX's note that it filtered its frames out
    of the traceback, nor the rule above that note."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        if line and not line.startswith(JAX_FILTER_NOTE) and set(line) != {"-"}:
            return line
    return ""


def exception_line(kind: str, message: str) -> str:
    """One line for an exception of type ``kind``: ``Type: first line of its message``; for a
    message that wraps another exception's traceback, that exception's own last line (its type
    and message, e.g. ``IndexError: Out-of-bounds block index (0, -1) ...``), never the
    traceback's header."""
    text = message.strip()
    if TRACEBACK_HEADER in text:
        inner = last_error_line(text.split(TRACEBACK_HEADER, 1)[1].lstrip(":"))
        if inner and not inner.startswith(("File ", TRACEBACK_HEADER)):
            return inner
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith(TRACEBACK_HEADER):
        first = ""
    return f"{kind}: {first}" if first else kind
