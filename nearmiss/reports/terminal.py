"""What the command line prints, made safe for a terminal: text a candidate or a model wrote
shows as text, never acts as a control sequence.

A candidate chooses its exception messages, its file names and what its child prints; a model
chooses its fix's summary and comments. All of that reaches the report a command prints. An
attack review (2026-12-05) had a candidate raise an exception whose message cleared the screen
and drew a fake report ending "verdict: CERTIFIED" over the real "NOT CERTIFIED" (the exit code
was still 1); a model's fix did the same to `repair`'s diff. So every control character but
newline and tab (C0, DEL, C1: the ESC of every ANSI sequence, a lone carriage return that
overwrites a line) and the Unicode controls that reorder text on screen are shown as escapes,
``\\x1b``, on everything the command line writes (``PrintableStream`` on stdout and stderr). The
one sequence the tool draws itself, a fleet's live table, goes through ``write_control``.
"""

from __future__ import annotations

import io
import re
from typing import TextIO

# C0 but tab and newline, DEL and C1; the bidirectional marks, embeddings, overrides and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character shown as an escape (newlines and tabs kept)."""
    return _CONTROL.sub(_escape, text)


class PrintableStream(io.TextIOBase):
    """A text stream that writes ``printable`` text to another."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def write_control(self, sequence: str) -> None:
        """A control sequence the tool itself draws with (never text it was given)."""
        self.raw.write(sequence)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", "utf-8")


def write_control(stream: TextIO, sequence: str) -> None:
    """Draw with ``sequence`` on ``stream``, through a ``PrintableStream`` where it is one."""
    if isinstance(stream, PrintableStream):
        stream.write_control(sequence)
    else:
        stream.write(sequence)
