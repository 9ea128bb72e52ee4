"""The spec's answers, kept: a check whose spec request was answered before replays the answer.

Every check starts the spec's child, which imports JAX, loads the spec, draws each case's inputs
and computes its reference: the same work, with the same result, in every check of the same spec
(every round of a repair, every member of a fleet on one operator). What that child writes is a
function of what it is given and nothing else: it sees the spec file alone (a copy, in its own
``spec/``), the engine package and the installed libraries, and its inputs come from keys drawn
from the seed. So once a child has answered a request in full (``done``), its messages and the
files they name are kept under a key that hashes all of it:

- the spec's bytes and the path its messages name;
- the request's fields that shape the answer (seed, suite, selection, integrity evidence);
- the platform; every installed distribution's name and version; the Python version; the
  engine package's source; the ``JAX_*``/``XLA_*`` settings a child inherits.

Only the engine reads and writes entries, from the host; no sandboxed child ever sees this
directory (a candidate's child and the executors get copies of inputs in their own homes, as
they always did). An entry is used only where the spec's child would run sandboxed (without the
sandbox a spec could read files the key does not cover) and only when no timing is asked for
(a device's reference times are measured per check). Entries are written whole, then renamed
into place; the least recently used go past ``MAX_ENTRIES``.

``NEARMISS_CACHE_DIR`` moves it with the compile cache (``compile_cache``);
``NEARMISS_CACHE_DIR=off`` turns both off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform as python_platform
import secrets
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.compile_cache import cache_root
from nearmiss.engine.runner.environment import (
    PACKAGE_DIR,
    Bubblewrap,
    find_sandbox,
    unsafe_requested,
)

MAX_ENTRIES = 400
MESSAGES_FILE = "messages.json"
# The request's fields that shape the spec's answer (``cmd``, the directories, ``controls`` and
# ``cache`` do not: a later control round is asked of a live child, never of an entry).
ANSWER_FIELDS = ("seed", "suite", "select", "integrity", "describe_only")


@functools.cache
def _installed() -> str:
    """Every installed distribution and its version, and the Python that runs them."""
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    return f"{python_platform.python_version()} {';'.join(names)}"


@functools.cache
def _engine_source() -> str:
    """A digest of the engine package's Python source, which the spec's child runs."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def entry_key(spec_copy: Path, request: dict[str, Any], platform: str) -> str | None:
    """The key of the answer to ``request`` (the spec's child's first request, its ``spec``
    the copy it reads), or None where no answer may be kept or used."""
    if int(request.get("profile_runs") or 0) > 0 or unsafe_requested():
        return None
    if not isinstance(find_sandbox(), Bubblewrap):
        return None
    try:
        spec_bytes = spec_copy.read_bytes()
    except OSError:
        return None  # the child reports a missing spec, every time
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_")))
    described = {
        "spec": hashlib.sha256(spec_bytes).hexdigest(),
        "shown": request.get("shown"),
        "request": {name: request.get(name) for name in ANSWER_FIELDS},
        "platform": platform,
        "installed": _installed(),
        "engine": _engine_source(),
        "settings": settings,
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _entries() -> Path | None:
    root = cache_root()
    if root is None:
        return None
    path = root / "ground-truth"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
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
        relative = [_moved(m, lambda p: str(Path(p).relative_to(cases))) for m in messages]
        # A case's inputs and its reference share its directory; its probes are inside it.
        for named in sorted({m["dir"] for m in relative if "dir" in m}):
            shutil.copytree(cases / named, staging / "cases" / named)
        staging.mkdir(exist_ok=True)
        (staging / MESSAGES_FILE).write_text(json.dumps(relative))
        os.rename(staging, final)
    except (OSError, ValueError):  # a path outside ``cases`` (ValueError) is never kept
        shutil.rmtree(staging, ignore_errors=True)
        return
    _evict(entries)


def replay(key: str, cases: Path) -> list[dict[str, Any]] | None:
    """A kept answer's messages, its files copied into ``cases`` (copies: nothing a check does
    with its files reaches the entry), or None where there is none."""
    entries = _entries()
    if entries is None:
        return None
    entry = entries / key
    try:
        messages = json.loads((entry / MESSAGES_FILE).read_text())
        kept = entry / "cases"
        if kept.is_dir():
            shutil.copytree(kept, cases, dirs_exist_ok=True)
        os.utime(entry)  # recently used
    except (OSError, ValueError):
        return None
    return [_moved(m, lambda p: str(cases / p)) for m in messages]


def _evict(entries: Path) -> None:
    kept = [p for p in entries.iterdir() if not p.name.startswith(".")]
    if len(kept) <= MAX_ENTRIES:
        return

    def used(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:  # removed meanwhile by another worker's eviction
            return 0.0

    kept.sort(key=used)
    for old in kept[: len(kept) - MAX_ENTRIES]:
        shutil.rmtree(old, ignore_errors=True)
