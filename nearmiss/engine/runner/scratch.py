"""Scratch directories that say who owns them, and a sweeper for the ones whose owner died.

A check, a candidate run or a reference run works in a directory of the temp dir; a worker
killed with SIGKILL never removes its own. ``scratch_dir(prefix)`` is a drop-in for
``Path(tempfile.mkdtemp(prefix=prefix))`` whose name also records its owner — pid, the process's
start time (so a reused pid is not mistaken for the owner) and the boot it belongs to:
``nearmiss-check-p1234s98765b1a2b3c4d-k3j2h1``. ``sweep_orphans()`` (run when a worker starts)
removes every such directory of ours whose owner is no longer alive on this machine, and
directories in the old, ownerless form once they are a day old. Nothing else is touched: other
names, other users' directories, directories of live processes.

``stop_orphaned_children()`` (run with it) kills what a dead owner may have left running in
them: bwrap processes whose command line names such a directory (the sandbox's home), and
unsandboxed children (``--unsafe-no-sandbox``) working in one. A child exits by itself once its
engine is gone (``runner.child``), but a bwrap killed mid-way through setting up a sandbox has
been seen to leave its inner half waiting for ever, with nobody to reap it. It also empties and
removes the cgroups of dead engines (``runner.cgroups``), which hold whatever their children
started, wherever it went.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from nearmiss.engine.runner import cgroups
from nearmiss.engine.runner.process_table import start_time

# The prefixes the engine's scratch directories have used (checkouts, candidate, reference and
# sandbox runs): what an ownerless directory must be named to be swept once old.
KINDS = ("check", "candidate", "reference", "executor", "tool", "audit", "probe")
_OWNED = re.compile(r"^nearmiss-(?P<kind>[a-z]+)-p(?P<pid>\d+)s(?P<start>\d+)b(?P<boot>[0-9a-f]+)-")
_OWNERLESS = re.compile(rf"^nearmiss-(?:{'|'.join(KINDS)})-[a-z0-9_]+$")
# The engine's children: what runs them when there is no sandbox (``python -m MODULE``).
CHILD_MODULES = "nearmiss.engine.runner."
# An ownerless directory (made before owners were recorded) may belong to a live process; none
# of the engine's runs lasts anywhere near this long.
OWNERLESS_AGE_S = 24 * 3600.0


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    return "0"


def _owner_tag() -> str:
    pid = os.getpid()
    return f"p{pid}s{start_time(pid) or 0}b{_boot_id()}-"


def scratch_dir(prefix: str) -> Path:
    """A new private directory (mode 0700) in the temp dir, its name starting with ``prefix``
    and recording this process as its owner. The caller removes it, as with ``mkdtemp``."""
    return Path(tempfile.mkdtemp(prefix=prefix + _owner_tag()))


def remove_tree(path: str | Path) -> None:
    """Remove a directory tree, whatever a sandbox child built in it. ``shutil.rmtree`` recurses
    once per level (CPython 3.11), so a home a candidate nested a thousand folders deep raised
    RecursionError past ``ignore_errors``, skipping the rest of a check's clean-up and stopping
    every later worker start at its sweep; coreutils' ``rm`` walks any depth without recursing."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True)


def _owner_alive(match: re.Match, boot: str) -> bool:
    if match["boot"] != boot:
        return False  # made before this machine last booted
    pid = int(match["pid"])
    if Path("/proc/self/stat").is_file():
        return start_time(pid) == int(match["start"])
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
            remove_tree(entry.path)
            removed += not os.path.lexists(entry.path)
    return removed


def _scratch_owner(pid: int) -> re.Match | None:
    """The owner tag of the scratch directory an engine's child works in, if ``pid`` is one:
    a bwrap naming such a directory on its command line (its home), or an unsandboxed child
    whose working directory is one. Any other process is no child of the engine's: None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if os.path.basename(argv[0]) == "bwrap":
        places = argv[1:]
    elif argv[1:2] == ["-m"] and len(argv) > 2 and argv[2].startswith(CHILD_MODULES):
        try:
            places = [os.readlink(f"/proc/{pid}/cwd")]
        except OSError:
            return None
    else:
        return None
    for place in places:
        for part in place.split("/"):
            owned = _OWNED.match(part)
            if owned is not None:
                return owned
    return None


def orphaned_children(started_since: int = 0) -> list[int]:
    """This user's engine children whose scratch directory's owner is dead (started at or after
    ``started_since``, in clock ticks since boot)."""
    boot, uid, me = _boot_id(), os.geteuid(), os.getpid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []  # no /proc: nothing to tell the engine's children by
    found = []
    for pid in pids:
        try:
            if pid == me or os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        owned = _scratch_owner(pid)
        if owned is None or _owner_alive(owned, boot):
            continue
        if (start_time(pid) or 0) >= started_since:
            found.append(pid)
    return found


def stop_orphaned_children() -> int:
    """Kill (SIGKILL) this user's engine children whose scratch directory's owner is dead;
    returns how many processes were killed. Children of live engines are left alone."""
    killed = 0
    for pid in orphaned_children():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed + cgroups.remove_orphaned_groups()
