"""What /proc says of a process, for telling a live owner from a dead one whose pid was reused."""

from __future__ import annotations

from pathlib import Path


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may contain spaces and parentheses); starttime is 22nd.
    return int(stat.rsplit(")", 1)[1].split()[19])
