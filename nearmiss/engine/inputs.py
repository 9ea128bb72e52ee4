"""The files a user hands the engine (a candidate, a spec), and the one way to parse Python.

``read_source`` is the only door through which a candidate's or a spec's text enters the engine:
what it refuses is never read past its metadata, never parsed, never stored. It accepts a
regular, UTF-8 ``.py`` file of at most ``MAX_SOURCE_BYTES``:

- the path must exist and name a regular file: a directory, a FIFO, a socket, a device
  (``/dev/zero``) is refused before it is opened, and so is anything under ``/proc``, ``/sys`` or
  ``/dev`` (pseudo-files that report a size of 0 and read as anything);
- a path whose last component is a symlink is followed (through any chain of links) only to a
  file inside the user's tree: the current working directory, the directory the path names
  as the file's own, or a directory the caller names (a fleet's root); symlinked directories
  on the way are the user's choice and are trusted; the filesystem root is no one's tree. A
  candidate that is a link to ``/etc/shadow`` or to a file beside the engine's secrets is
  refused;
- both the name given and the file it resolves to end in ``.py`` (the interpreter loads nothing
  else as a module);
- the bytes are UTF-8 (a UTF-8 byte-order mark is allowed, and stripped), contain no NUL, and
  declare no other encoding: a ``# coding:`` cookie would make the interpreter run text other
  than the text the static gate read.

Anything else raises ``UsageError`` with a one-line reason (the CLI exits 2). The size is
checked against the metadata before reading, and again on what is read.

``AST_LOCK`` serialises the building of Python ASTs: CPython 3.11 keeps the constructor's
recursion depth in interpreter-wide state, so two threads building one at once (a collection
switching threads in between) can fail with ``SystemError: AST constructor recursion depth
mismatch`` (CPython gh-106905; seen in a check whose executor thread read an array file while
the main thread read another). ``parse_source`` holds it for every parse of candidate or spec
text, and ``runner.arrays`` while NumPy reads an ``.npz`` (its headers are read with
``ast.literal_eval``).
"""

from __future__ import annotations

import ast
import io
import os
import stat
import threading
import tokenize
from pathlib import Path
from typing import Literal, overload

from nearmiss.engine.errors import UsageError

MAX_SOURCE_BYTES = 1 << 20  # 1 MiB: a kernel is a few hundred lines
SPECIAL_TREES = ("/proc", "/sys", "/dev")
AST_LOCK = threading.RLock()


@overload
def parse_source(
    source: str | bytes, filename: str = ..., mode: Literal["exec"] = ...
) -> ast.Module: ...
@overload
def parse_source(source: str | bytes, filename: str, mode: Literal["eval"]) -> ast.Expression: ...
@overload
def parse_source(source: str | bytes, *, mode: Literal["eval"]) -> ast.Expression: ...


def parse_source(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """``ast.parse`` under ``AST_LOCK`` (see the module docstring)."""
    with AST_LOCK:
        return ast.parse(source, filename=filename, mode=mode)


def _inside(path: str, root: str) -> bool:
    return root != os.sep and os.path.commonpath([path, root]) == root


def _special(path: str) -> bool:
    return any(path == tree or path.startswith(tree + os.sep) for tree in SPECIAL_TREES)


def _resolve(role: str, given: Path, tree: str | Path | None) -> str:
    """The real path of ``given``, refused when it is a link leaving the user's tree."""
    try:
        link = stat.S_ISLNK(os.lstat(given).st_mode)
        real = os.path.realpath(given, strict=True)
    except FileNotFoundError:
        raise UsageError(f"{role} file not found: {given}") from None
    except OSError as exc:  # a loop of links, a permission denied on the way...
        raise UsageError(f"cannot read {role} {given}: {exc.strerror or exc}") from None
    if link:
        roots = {
            os.path.realpath(os.getcwd()),
            os.path.realpath(os.path.dirname(os.path.abspath(given))),
        }
        if tree is not None:
            roots.add(os.path.realpath(tree))
        if not any(_inside(real, root) for root in roots):
            raise UsageError(
                f"{role} {given} is a symlink to {real}, outside the working directory and "
                "the file's own directory"
            )
    return real


def _check_metadata(role: str, given: Path, info: os.stat_result, real: str) -> None:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise UsageError(f"{role} {given} is a directory, not a .py file")
    if not stat.S_ISREG(mode) or _special(real):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a special file"
        )
        shown = given if os.path.abspath(given) == real else f"{given} ({real})"
        raise UsageError(f"{role} {shown} is {kind}, not a regular .py file")
    if info.st_size > MAX_SOURCE_BYTES:
        raise UsageError(
            f"{role} {given} has {info.st_size} bytes; at most {MAX_SOURCE_BYTES} are accepted"
        )


def _read(role: str, given: Path, real: str) -> bytes:
    """At most MAX_SOURCE_BYTES + 1 bytes of the regular file ``real``, with its metadata
    checked first (a FIFO or device is never opened) and again on the open descriptor (the
    file cannot be swapped in between)."""
    try:
        before = os.stat(real)
        _check_metadata(role, given, before, real)
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(real, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"cannot read {role} {given}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            raise UsageError(f"{role} {given} changed while it was being read")
        _check_metadata(role, given, info, real)
        chunks, size = [], 0
        while size <= MAX_SOURCE_BYTES:
            chunk = os.read(fd, MAX_SOURCE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"cannot read {role} {given}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_SOURCE_BYTES:
        raise UsageError(f"{role} {given} has more than {MAX_SOURCE_BYTES} bytes")
    if len(data) > info.st_size:  # a pseudo-file reporting a size it does not have
        raise UsageError(f"{role} {given} is not a regular .py file (it grew while read)")
    return data


def _decode(role: str, given: Path, data: bytes) -> str:
    if b"\0" in data:
        raise UsageError(f"{role} {given} is not text: it contains NUL bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"byte 0x{data[exc.start]:02x} at offset {exc.start}"
        raise UsageError(f"{role} {given} is not UTF-8 text ({where})") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise UsageError(f"{role} {given}: {exc.msg}") from None
    if encoding not in ("utf-8", "utf-8-sig"):
        raise UsageError(
            f"{role} {given} declares the encoding {encoding!r}; only UTF-8 is accepted"
        )
    return text


def read_source(role: str, path: str | Path, *, tree: str | Path | None = None) -> str:
    """The text of the ``role`` file ("candidate", "spec") at ``path``, or UsageError with a
    one-line reason when it is not a regular UTF-8 ``.py`` file in the user's tree (see the
    module docstring for the rules). ``tree`` adds a directory whose subtree also counts as
    the user's (a fleet's directory, or its manifest's)."""
    given = Path(path)
    if given.suffix != ".py":
        if given.is_dir():
            raise UsageError(f"{role} {given} is a directory, not a .py file")
        if not os.path.lexists(given):
            raise UsageError(f"{role} file not found: {given}")
        raise UsageError(f"{role} {given} is not a .py file")
    real = _resolve(role, given, tree)
    if not real.endswith(".py"):
        raise UsageError(f"{role} {given} resolves to {real}, which is not a .py file")
    return _decode(role, given, _read(role, given, real))
