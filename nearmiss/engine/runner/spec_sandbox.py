"""Starting the spec's child (``reference_child``): the sandboxed process where a spec's code runs.

Besides the engine it sees three host paths, all inside its work directory but the cache, bound
when it starts:

- ``spec/``, read-only: the engine copies the spec file in when it names it (a snapshot, as the
  candidate's is: the file is read once, never again by path);
- ``cases/``, writable: each case's inputs and reference, read by the engine and the executors;
- the reference compile cache (``compile_cache``), writable, when it is on.

Knowing them before the spec is known lets a busy worker start the child ahead of its check
(``runner.spares``): the spec's JAX start-up then overlaps the previous check too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.compile_cache import reference_cache_dir
from nearmiss.engine.runner.cpu_compile import spec_child_xla_flags
from nearmiss.engine.runner.sandbox import Limits, SandboxChild

REFERENCE_MODULE = "nearmiss.engine.runner.reference_child"
REFERENCE_PREFIX = "nearmiss-reference-"


def start_spec_child(workdir: Path, limits: Limits, platform: str) -> SandboxChild:
    """The spec's child for ``workdir`` (made by ``scratch_dir``; removed by the caller), its
    home ``workdir/home``."""
    (workdir / "spec").mkdir(exist_ok=True)
    (workdir / "cases").mkdir(exist_ok=True)
    cache = reference_cache_dir()
    return SandboxChild(
        REFERENCE_MODULE,
        workdir / "home",
        limits,
        platform,
        read_only=(workdir / "spec",),
        writable=(workdir / "cases",) + ((cache,) if cache else ()),
        # Its inputs and reference compile op by op: the cheaper emitter, the same numbers.
        extra_env={"XLA_FLAGS": spec_child_xla_flags(os.environ.get("XLA_FLAGS", ""))},
    )


def read_spec(spec: Path) -> bytes | None:
    """The spec's bytes, read once (None: unreadable, which the spec's child reports)."""
    try:
        return spec.read_bytes()
    except OSError:
        return None


def spec_request(workdir: Path, spec: Path, text: bytes | None = None) -> dict[str, Any]:
    """The first request's fields that name the spec and the child's directories, the spec
    copied in now (``text``: the bytes already read of it). ``shown`` is the user's path, the
    one the child's messages name."""
    copy = workdir / "spec" / spec.name
    copy.parent.mkdir(exist_ok=True)  # before the child starts, where its answer is kept
    text = read_spec(spec) if text is None else text
    # A spec that cannot be read is left out: the child reports it missing, under its own name.
    if text is not None:
        copy.write_bytes(text)
    cache = reference_cache_dir()
    return {
        "spec": str(copy),
        "shown": str(spec),
        "workdir": str(workdir / "cases"),
        "cache": str(cache or ""),
    }
