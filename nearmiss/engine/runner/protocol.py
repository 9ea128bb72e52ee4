"""JSON-lines messages between the engine and a sandbox child, over dedicated pipes.

The child's stdout and stderr go to log files, so nothing a candidate prints can be mistaken for
a message. The child finds its two descriptors in ``NEARMISS_CHANNEL_FDS`` ("read,write").
"""

from __future__ import annotations

import json
import os
from typing import Any

CHANNEL_ENV = "NEARMISS_CHANNEL_FDS"
MAX_MESSAGE = 8 * 1024 * 1024  # a message is metadata only; arrays travel as files
OUTPUT_FILE = "output.npz"  # where a child files a case's (or a probe's) outputs


class ChannelClosed(EOFError):
    """The other side closed its end (in a child: the engine went away)."""


class LineReader:
    """Buffered reader of newline-terminated JSON messages from a raw file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def pending(self) -> dict[str, Any] | None:
        """A complete message already buffered, if any."""
        if b"\n" not in self._buffer:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except RecursionError as exc:  # "[[[[…": a malformed message, not the reader's crash
            raise ValueError("a message nested too deeply") from exc

    def feed(self) -> bool:
        """Read what is available (one read); False on end of file."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            return False
        self._buffer += chunk
        if len(self._buffer) > MAX_MESSAGE:
            raise ValueError("oversized message on sandbox channel")
        return True

    def read_blocking(self) -> dict[str, Any]:
        while True:
            message = self.pending()
            if message is not None:
                return message
            if not self.feed():
                raise ChannelClosed()


def write_message(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message, default=str) + "\n").encode()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
