"""The spec's answers, kept: a check whose spec request was answered before replays the answer.

Every check starts the spec's child, which imports JAX, loads the spec, draws each case's inputs
and computes its reference: the same work, with the same result, in every check of the same spec
(every round of a repair, every member of a fleet on one operator). What that child writes is a
function of what it is given and nothing else: it sees the spec file alone (a copy, in its own
``spec/``), the engine package and the installed libraries, and its inputs come from keys drawn
from the seed. So once a child has answered a request in full (``done``), its messages and the
files they name are kept under a key that hashes all of it:

- the spec's bytes and the path its messages name;
- the request's fields that shape the answer (seed, suite, selection, integrity evidence) and
  the child's memory limit;
- every installed distribution's name and version, the Python version and the engine package's
  source, re-read whenever a site directory or an engine file changes (a long-lived worker
  upgraded in place keys its next answers anew);
- the environment the child is given (``child_environment``, less its own directories), and
  the CPU XLA compiles for: its model, its flags and the cores this process may use;
- the system's libraries, which the child maps from the host's ``/usr``: the C library's
  version and the system's package database (an upgrade of glibc's ``libm``, which NumPy and a
  spec's math may call, rewrites it).

Only the engine reads and writes entries, from the host; no sandboxed child ever sees this
directory (a candidate's child and the executors get copies of inputs in their own homes, as
they always did), and the cache is off where it would lie under a path every child sees (the
system, the interpreter's directories, the engine) or is not this user's alone. An entry is used
only on the CPU (a device's answer depends on its model, driver and toolkit, and its reference
times are measured per check), and only where the spec's child would run sandboxed (without the
sandbox a spec could read files the key does not cover). Entries are written whole, each file's
digest with them, then renamed into place; a replay whose copies do not match their digests
drops the entry. Removal renames first, so a replay never reads half an entry; the least
recently used go once there are more than ``MAX_ENTRIES`` or they hold more than ``MAX_BYTES``.

A failing check then asks the spec's child for control cases (``forensics.controls``), in up to
a few rounds. Each round's answer is kept the same way, under the request's key and the cases
the round asks (``round_key``): the next check of the same spec asking the same controls (a
repair's next round, another kernel planted in the same module) starts no spec child at all.

``NEARMISS_CACHE_DIR`` moves it with the compile cache (``compile_cache``);
``NEARMISS_CACHE_DIR=off`` turns both off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform as python_platform
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.compile_cache import cache_root
from nearmiss.engine.runner.environment import (
    PACKAGE_DIR,
    SYSTEM_DIRS,
    Bubblewrap,
    child_environment,
    find_sandbox,
    interpreter_paths,
    unsafe_requested,
)
from nearmiss.engine.runner.sandbox import Limits
from nearmiss.engine.runner.scratch import remove_tree

MAX_ENTRIES = 400
MAX_BYTES = 1024**3
STALE_STAGING_S = 3600  # a staging directory this old was left by a process that died
MESSAGES_FILE = "messages.json"
SIZE_FILE = "bytes"
# The request's fields that shape the spec's answer (``cmd``, the directories, ``controls`` and
# ``cache`` do not: a later control round is asked of a live child, never of an entry).
ANSWER_FIELDS = ("seed", "suite", "select", "integrity", "describe_only")


_signatures: dict[str, tuple[object, str]] = {}


def _remembered(name: str, stamp: object, compute: Callable[[], str]) -> str:
    """``compute()``, again only when ``stamp`` (what it depends on, cheaply read) changes."""
    known = _signatures.get(name)
    if known is None or known[0] != stamp:
        known = (stamp, compute())
        _signatures[name] = known
    return known[1]


def _stamp(paths: list[Path]) -> tuple:
    stamps = []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            continue
        stamps.append((str(path), info.st_mtime_ns, info.st_size))
    return tuple(stamps)


def _entries_of(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:  # a folder on sys.path this process may not list: nothing of it to key
        return []


def _installed() -> str:
    """Every installed distribution and its version, and the Python that runs them. An install
    or upgrade adds or renames a ``dist-info`` directory (``name-version.dist-info``), changing
    its site directory's stamp. The directories' names, not their metadata: parsing every
    ``METADATA`` file took 0.15 s a check where a folder on ``sys.path`` changes between checks
    (a script's own folder in /tmp)."""
    sites = [Path(p) for p in sys.path if p and Path(p).is_dir()]

    def listing() -> str:
        names = sorted(
            entry.name
            for site in sites
            for entry in _entries_of(site)
            if entry.name.endswith((".dist-info", ".egg-info"))
        )
        return f"{python_platform.python_version()} {';'.join(names)}"

    return _remembered("installed", _stamp(sites), listing)


def _engine_source() -> str:
    """A digest of the engine package's Python source, which the spec's child runs."""
    files = sorted(PACKAGE_DIR.rglob("*.py"))

    def digest() -> str:
        hashed = hashlib.sha256()
        for path in files:
            hashed.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + path.read_bytes())
        return hashed.hexdigest()

    return _remembered("engine", _stamp(files), digest)


@functools.cache
def _cpu() -> str:
    """The CPU XLA compiles for (model and flags) and the cores this process may use."""
    described = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                described += line.split(":", 1)[-1].strip() + "\n"
            if line.strip() == "":
                break  # the first processor's lines describe them all here
    return f"{described}{len(os.sched_getaffinity(0))} cores"


# Where the system's package managers record what is installed (Debian's dpkg, RPM's two
# formats, Alpine's apk): any install, upgrade or removal rewrites the one in use.
PACKAGE_DATABASES = (
    Path("/var/lib/dpkg/status"),
    Path("/var/lib/rpm/rpmdb.sqlite"),
    Path("/var/lib/rpm/Packages"),
    Path("/lib/apk/db/installed"),
)


def _system() -> str:
    """The C library's version and the stamps of the system's package databases."""
    libc = ""
    with contextlib.suppress(ValueError, OSError):
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    return json.dumps([libc, _stamp(list(PACKAGE_DATABASES))])


def entry_key(
    spec_bytes: bytes | None, request: dict[str, Any], platform: str, limits: Limits
) -> str | None:
    """The key of the answer to ``request`` (the spec's child's first request, without the
    fields that name its directories) for a spec of ``spec_bytes``, or None where no answer may
    be kept or used."""
    if spec_bytes is None or platform != "cpu" or int(request.get("profile_runs") or 0) > 0:
        return None
    if unsafe_requested() or not isinstance(find_sandbox(), Bubblewrap):
        return None
    environment = child_environment(Path("/home"), extra={"JAX_PLATFORMS": platform})
    for own in ("HOME", "TMPDIR", "PYTHONPATH"):  # the child's directories, not its settings
        environment.pop(own, None)
    described = {
        "spec": hashlib.sha256(spec_bytes).hexdigest(),
        "shown": request.get("shown"),
        "request": {name: request.get(name) for name in ANSWER_FIELDS},
        "memory_mb": limits.memory_mb,
        "max_tasks": limits.max_tasks,
        "platform": platform,
        "installed": _installed(),
        "engine": _engine_source(),
        "environment": sorted(environment.items()),
        "cpu": _cpu(),
        "system": _system(),
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def round_key(key: str, wanted: list[dict[str, Any]]) -> str:
    """The key of a control round's answer (``wanted``: the control cases the engine asks of
    the spec's child after it answered the request kept under ``key``). A control is drawn
    from its own key and computed by the loaded spec: the request and the cases asked are all
    its answer depends on, whichever child or round asks."""
    text = json.dumps({"request": key, "controls": wanted}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _entries() -> Path | None:
    """The entries' directory, or None: caching is off, or the directory could be read by a
    child (under a path every child sees) or written by another user."""
    root = cache_root()
    if root is None:
        return None
    path = (root / "ground-truth").absolute()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = path.resolve()
        info = path.stat()
    except OSError:
        return None
    seen = [Path(d) for d in SYSTEM_DIRS] + list(interpreter_paths()) + [PACKAGE_DIR]
    if any(path == d or path.is_relative_to(d) for d in seen):
        return None  # a candidate could read the references it is compared against
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None  # another user could plant answers
    for parent in path.parents:  # or swap a folder above it (a sticky /tmp cannot)
        try:
            above = parent.stat()
        except OSError:
            return None
        open_to_others = above.st_mode & 0o022 and not above.st_mode & 0o1000
        if above.st_uid not in (0, os.getuid()) or open_to_others:
            return None
    return path


def _moved(message: dict[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
    """``message`` with the paths it names (``dir``, each probe's) passed through ``where``."""
    out = dict(message)
    if "dir" in out:
        out["dir"] = where(out["dir"])
    if out.get("probes"):
        out["probes"] = [{**probe, "dir": where(probe["dir"])} for probe in out["probes"]]
    return out


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def keep(key: str, messages: list[dict[str, Any]], cases: Path) -> None:
    """Keep a full answer (``messages`` ending with ``done``) and the case files they name,
    read from ``cases`` now. A failure to write costs the next check its child, nothing more."""
    entries = _entries()
    if entries is None or not messages or messages[-1].get("event") != "done":
        return
    final = entries / key
    if final.exists():
        return
    staging = entries / f".staging-{secrets.token_hex(8)}"
    try:
        relative = [_moved(m, lambda p: _inside(Path(p), cases)) for m in messages]
        # A case's inputs and its reference share its directory; its probes are inside it.
        for named in sorted({m["dir"] for m in relative if "dir" in m}):
            source = cases / named
            if any(p.is_symlink() or not (p.is_dir() or p.is_file()) for p in source.rglob("*")):
                raise ValueError(f"{named} holds a link or a special file")
            shutil.copytree(source, staging / "cases" / named)
        staging.mkdir(exist_ok=True)
        files = _digests(staging / "cases") if (staging / "cases").is_dir() else {}
        kept = {"messages": relative, "files": files}
        (staging / MESSAGES_FILE).write_text(json.dumps(kept))
        (staging / SIZE_FILE).write_text(str(_bytes_under(staging)))
        os.rename(staging, final)
    except (OSError, ValueError):  # a path outside ``cases`` (ValueError) is never kept
        remove_tree(staging)
        return
    with contextlib.suppress(OSError):  # the cache removed meanwhile, say
        _evict(entries, final.name)


def _plain(name: str) -> bool:
    """A relative path of plain names: never absolute, never ``..``."""
    path = Path(name)
    return bool(path.parts) and not path.is_absolute() and ".." not in path.parts


def _inside(path: Path, cases: Path) -> str:
    """``path`` relative to ``cases``: ValueError unless it is a folder inside it, links and
    ``..`` resolved."""
    resolved = path.resolve(strict=True)
    named = str(resolved.relative_to(cases.resolve(strict=True)))
    if not _plain(named) or path.is_symlink() or not resolved.is_dir():
        raise ValueError(f"{path} is not a folder inside {cases}")
    return named


def has(key: str) -> bool:
    """Whether an answer is kept under ``key`` (``replay`` may still find none: eviction)."""
    entries = _entries()
    return entries is not None and (entries / key / MESSAGES_FILE).is_file()


def replay(key: str, cases: Path) -> list[dict[str, Any]] | None:
    """A kept answer's messages, its files copied into ``cases`` (copies: nothing a check does
    with its files reaches the entry), or None where there is none. An entry whose copies do
    not match the digests it was kept with is dropped, and the copies with it."""
    entries = _entries()
    if entries is None:
        return None
    entry = entries / key
    try:
        kept = json.loads((entry / MESSAGES_FILE).read_text())
    except (OSError, ValueError):
        return None  # none kept (or being removed)
    try:
        messages, files = _checked(kept)
    except (KeyError, TypeError, ValueError, AttributeError):
        _remove(entry)  # not what ``keep`` writes
        return None
    copied = sorted({Path(name).parts[0] for name in files})
    try:
        if files:
            shutil.copytree(entry / "cases", cases, dirs_exist_ok=True)
        whole = all(_digests(cases / top) == _part(files, top) for top in copied)
    except OSError:  # a full disk, say: the entry may be fine, this copy is not
        whole = None
    if not whole:
        for top in copied:
            remove_tree(cases / top)
        if whole is False:
            _remove(entry)
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # recently used
    return [_moved(m, lambda p: str(cases / p)) for m in messages]


def _checked(kept: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """An entry's messages and file digests, as ``keep`` writes them: ValueError otherwise
    (a path that is not plain, a message naming a folder the entry does not hold)."""
    messages, files = kept["messages"], kept["files"]
    if not isinstance(messages, list) or not isinstance(files, dict):
        raise ValueError("not an entry")
    if not all(isinstance(n, str) and _plain(n) and isinstance(d, str) for n, d in files.items()):
        raise ValueError("a file name that is not plain")
    tops = {Path(name).parts[0] for name in files}
    for message in messages:
        named = [message.get("dir")] + [p.get("dir") for p in message.get("probes") or []]
        for name in (n for n in named if n is not None):
            if not isinstance(name, str) or not _plain(name) or Path(name).parts[0] not in tops:
                raise ValueError(f"a message names {name!r}")
    if not messages or messages[-1].get("event") != "done":
        raise ValueError("an unfinished answer")
    return messages, files


def _part(files: dict[str, str], top: str) -> dict[str, str]:
    """The digests of the files under ``top``, relative to it."""
    prefix = f"{top}/"
    return {
        name[len(prefix) :]: digest for name, digest in files.items() if name.startswith(prefix)
    }


def _remove(entry: Path) -> None:
    """Rename first, so no replay reads a half-removed entry; then delete."""
    trash = entry.parent / f".trash-{secrets.token_hex(8)}"
    try:
        os.rename(entry, trash)
    except OSError:
        return  # gone already
    remove_tree(trash)


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _size(entry: Path) -> int:
    """An entry's bytes, as ``keep`` wrote them down (counted again where it did not)."""
    try:
        return int((entry / SIZE_FILE).read_text())
    except (OSError, ValueError):
        return _bytes_under(entry)


def _evict(entries: Path, newest: str) -> None:
    """Remove the least recently used entries past the bounds (never ``newest``, the one just
    written), and staging or trash left by processes that died."""
    now = time.time()
    kept = []
    for path in entries.iterdir():
        try:
            used = path.stat().st_mtime
            if path.name.startswith("."):
                if now - used > STALE_STAGING_S:
                    remove_tree(path)
                continue
            kept.append((used, _size(path), path))
        except OSError:  # removed meanwhile by another process
            continue
    kept.sort()
    total = sum(size for _, size, _ in kept)
    count = len(kept)
    for _, size, path in kept:
        if count <= MAX_ENTRIES and total <= MAX_BYTES:
            break
        if path.name == newest:
            continue
        _remove(path)
        count, total = count - 1, total - size
