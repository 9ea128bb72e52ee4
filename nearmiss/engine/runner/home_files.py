"""Files the engine puts into, and takes out of, a child's home, without following a link.

A child's home is the one directory it can write, and the engine works in it from the host. A
candidate can put links there (``cases`` pointing at a host folder, ``inputs.npz`` at a host
file), and a plain ``shutil.copy`` or ``mkdir(parents=True)`` by path follows them: with the
engine's rights, onto the host. So every path below the home is walked one folder at a time from
a descriptor (``O_NOFOLLOW``), files are created fresh (``O_EXCL``) after removing whatever has
the name (a link is removed, never followed), and a file taken out must be a regular file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(relative: str) -> list[str]:
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"not a plain relative path: {relative!r}")
    return parts


def _folder(home: Path, parts: list[str], create: bool) -> int:
    """A descriptor of home/parts, each folder opened from the one above it, none a link."""
    fd = os.open(home, _FOLDER)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            inner = os.open(part, _FOLDER, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_folder(home: Path, relative: str) -> Path:
    """home/relative, created where missing; raises OSError where a link stands in the way."""
    os.close(_folder(home, _parts(relative), create=True))
    return home / relative


@contextlib.contextmanager
def _created(home: Path, relative: str) -> Iterator[BinaryIO]:
    """A new file at home/relative (folders created), replacing what has the name there."""
    *folders, name = _parts(relative)
    fd = _folder(home, folders, create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)  # a link goes, its target stays untouched
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(name, flags, 0o644, dir_fd=fd), "wb") as out:
            yield out
    finally:
        os.close(fd)


def put(source: Path, home: Path, relative: str) -> Path:
    """Copy the engine's ``source`` to home/relative."""
    with _created(home, relative) as out, open(source, "rb") as src:
        shutil.copyfileobj(src, out)
    return home / relative


def write(home: Path, relative: str, data: bytes) -> Path:
    """Write ``data`` to home/relative."""
    with _created(home, relative) as out:
        out.write(data)
    return home / relative


@contextlib.contextmanager
def _opened(home: Path, relative: str, max_bytes: int) -> Iterator[BinaryIO]:
    """The child's regular file home/relative, open for reading. ValueError where it is missing,
    not a regular file, or larger than ``max_bytes``."""
    *folders, name = _parts(relative)
    try:
        fd = _folder(home, folders, create=False)
    except OSError as exc:
        raise ValueError(f"the child filed no {relative} ({exc.strerror})") from exc
    try:
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            src = os.open(name, flags, dir_fd=fd)
        except OSError as exc:
            raise ValueError(f"the child filed no {relative} ({exc.strerror})") from exc
        with open(src, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"the child filed no {relative} (not a regular file)")
            if info.st_size > max_bytes:
                raise ValueError(f"a file of more than {max_bytes} bytes: {relative}")
            yield source
    finally:
        os.close(fd)


def _chunks(home: Path, relative: str, max_bytes: int) -> Iterator[bytes]:
    """The child's regular file home/relative, read in chunks, never more than ``max_bytes``:
    the child may still be writing to it. ValueError where it is missing, not a regular file,
    or too large."""
    with _opened(home, relative, max_bytes) as source:
        read = 0
        while chunk := source.read(min(1 << 20, max_bytes + 1 - read)):
            read += len(chunk)
            if read > max_bytes:
                raise ValueError(f"a file of more than {max_bytes} bytes: {relative}")
            yield chunk


def read(home: Path, relative: str, max_bytes: int) -> bytes:
    """The content of the child's regular file home/relative (as ``_chunks``)."""
    return b"".join(_chunks(home, relative, max_bytes))


def take(home: Path, relative: str, destination: Path, max_bytes: int) -> None:
    """Move the child's regular file home/relative to the engine's ``destination`` (a copy, then
    the child's removed). ValueError where it is missing, not a regular file, or too large."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with open(destination, "wb") as out:
        for chunk in _chunks(home, relative, max_bytes):
            out.write(chunk)
    remove(home, relative)


def remove(home: Path, relative: str) -> None:
    """Remove home/relative if it is there (a link goes, its target stays untouched)."""
    *folders, name = _parts(relative)
    try:
        fd = _folder(home, folders, create=False)
    except OSError:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
