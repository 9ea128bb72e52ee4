"""A persistent XLA compilation cache for the spec's child, and only for it.

Drawing a case's inputs and computing its reference compile a handful of small XLA programs
(the PRNG, ``normal``, the reference's ops) for every new shape: on two cores that is most of
what the spec's child does, and it is the same work in every check of the same spec. JAX's own
persistent cache (``jax_compilation_cache_dir``) keeps those executables on disk between
processes. The directory is bound writable into the spec's child alone: the candidate's child
and the artifact executor never see it, so nothing a candidate does can put an executable there.
Entries are keyed by the program's HLO, JAX version and backend, so a stale entry cannot be
picked for another program. ``filelock`` guards concurrent children (JAX's ``LRUCache`` locks
only when a size bound is set, which also evicts the least recently used entries).

``NEARMISS_CACHE_DIR`` moves it (default ``$XDG_CACHE_HOME/nearmiss`` or ``~/.cache/nearmiss``);
``NEARMISS_CACHE_DIR=off`` turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CACHE_ENV = "NEARMISS_CACHE_DIR"
MAX_CACHE_BYTES = 512 * 1024**2


def cache_root(env: Mapping[str, str] | None = None) -> Path | None:
    """The engine's cache directory (None: caching is off); see also ``truth_cache``."""
    env = os.environ if env is None else env
    configured = env.get(CACHE_ENV, "")
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured)
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(base) / "nearmiss"


def reference_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """Where the spec's children keep compiled programs (None: caching is off)."""
    root = cache_root(env)
    if root is None:
        return None
    path = root / "jax-reference"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:  # a read-only home: checks work, only slower
        return None
    return path.resolve()


def enable_persistent_cache(jax, path: str) -> None:
    """In the spec's child, before anything compiles: cache every compiled program."""
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
