"""A folder's metadata, noted and put back: what a process that may write a folder can change
about it besides its entries (mode, owner, times, extended attributes), for the folders a
zygote's children share one after another (``runner.zygote``). Emptying such a folder is not
enough: one child could leave a mode that locks the next out, or words in an attribute or a
timestamp for the next to read."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

USER_ATTRIBUTES = "user."  # the namespace an unprivileged process can write


@dataclass(frozen=True)
class FolderState:
    device: int
    inode: int
    mode: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int


def noted(path: str | Path) -> FolderState | None:
    """The folder's state, never through a link; None where it is not a folder."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    return FolderState(
        info.st_dev,
        info.st_ino,
        info.st_mode,
        info.st_uid,
        info.st_gid,
        info.st_atime_ns,
        info.st_mtime_ns,
    )


def _same(current: FolderState | None, state: FolderState) -> bool:
    return current is not None and (current.device, current.inode) == (state.device, state.inode)


def same_folder(path: str | Path, state: FolderState) -> bool:
    """Whether ``path`` is still the folder ``state`` was noted of (device and inode)."""
    return _same(noted(path), state)


def _attributes(path: str | Path) -> list[str]:
    return [
        name
        for name in os.listxattr(path, follow_symlinks=False)
        if name.startswith(USER_ATTRIBUTES)
    ]


def put_back(path: str | Path, state: FolderState) -> bool:
    """Put the folder's owner, mode and times back as ``state`` says, and remove its user
    attributes; whether it is then the same folder, as noted, with none. Only while nothing
    else can change it (the child that could is gone)."""
    current = noted(path)
    if current is None or not _same(current, state):
        return False
    try:  # the mode first: a folder its owner may not write keeps its attributes from it
        if (current.uid, current.gid) != (state.uid, state.gid):
            os.chown(path, state.uid, state.gid, follow_symlinks=False)
        os.chmod(path, stat.S_IMODE(state.mode))
        for name in _attributes(path):
            os.removexattr(path, name, follow_symlinks=False)
        os.utime(path, ns=(state.atime_ns, state.mtime_ns), follow_symlinks=False)
        return noted(path) == state and not _attributes(path)
    except OSError:
        return False
