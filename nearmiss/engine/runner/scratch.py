"""Scratch directories that say who owns them, and a sweeper for the ones whose owner died.

A check, a candidate run or a reference run works in a directory of the temp dir; a worker
killed with SIGKILL never removes its own. ``scratch_dir(prefix)`` is a drop-in for
``Path(tempfile.mkdtemp(prefix=prefix))`` whose name also records its owner — pid, the process's
start time (so a reused pid is not mistaken for the owner) and the boot it belongs to:
``nearmiss-check-p1234s98765b1a2b3c4d-k3j2h1``. ``sweep_orphans()`` (run when a worker starts)
removes every such directory of ours whose owner is no longer alive on this machine, and
directories in the old, ownerless form once they are a day old. Nothing else is touched: other
names, other users' directories, directories of live processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

# The prefixes the engine's scratch directories have used (checkouts, candidate, reference and
# sandbox runs): what an ownerless directory must be named to be swept once old.
KINDS = ("check", "candidate", "reference", "executor", "tool", "audit", "probe")
_OWNED = re.compile(r"^nearmiss-(?P<kind>[a-z]+)-p(?P<pid>\d+)s(?P<start>\d+)b(?P<boot>[0-9a-f]+)-")
_OWNERLESS = re.compile(rf"^nearmiss-(?:{'|'.join(KINDS)})-[a-z0-9_]+$")
# An ownerless directory (made before owners were recorded) may belong to a live process; none
# of the engine's runs lasts anywhere near this long.
OWNERLESS_AGE_S = 24 * 3600.0


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    return "0"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may contain spaces and parentheses); starttime is 22nd.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _owner_tag() -> str:
    pid = os.getpid()
    return f"p{pid}s{_start_time(pid) or 0}b{_boot_id()}-"


def scratch_dir(prefix: str) -> Path:
    """A new private directory (mode 0700) in the temp dir, its name starting with ``prefix``
    and recording this process as its owner. The caller removes it, as with ``mkdtemp``."""
    return Path(tempfile.mkdtemp(prefix=prefix + _owner_tag()))


def _owner_alive(match: re.Match, boot: str) -> bool:
    if match["boot"] != boot:
        return False  # made before this machine last booted
    pid = int(match["pid"])
    if Path("/proc/self/stat").is_file():
        return _start_time(pid) == int(match["start"])
    try:  # no /proc: the pid alone must do (a reused pid keeps a directory, never the reverse)
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep_orphans(root: Path | None = None) -> int:
    """Remove the scratch directories under ``root`` (default: the temp dir) whose owner is dead;
    returns how many were removed. Safe to run while other processes use theirs."""
    root = Path(root or tempfile.gettempdir())
    boot, uid, now = _boot_id(), os.geteuid(), time.time()
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith("nearmiss-"):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or info.st_uid != uid:
            continue
        owned = _OWNED.match(entry.name)
        if owned is not None:
            orphan = not _owner_alive(owned, boot)
        else:
            orphan = bool(_OWNERLESS.match(entry.name)) and now - info.st_mtime > OWNERLESS_AGE_S
        if orphan:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += not os.path.lexists(entry.path)
    return removed
