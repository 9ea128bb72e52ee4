"""Errors every layer shares: a usage error is the user's input, never a finding or a crash;
and the line of a dead child's log that says what killed it."""

from __future__ import annotations


class UsageError(Exception):
    """The inputs are unusable (bad spec, no kernel...): a one-line reason, exit status 2."""


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
