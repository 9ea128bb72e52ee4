"""The environment a sandbox child gets: an allowlist of what JAX needs, nothing else.

API keys, database DSNs and anything else in the engine's environment never reach candidate code:
variables are copied only when their name is on the allowlist *and* does not look like a secret.
Where Linux namespaces are available (root, util-linux ``unshare``), the child also gets its own
PID namespace with a private /proc — so it cannot read another process's environment through
``/proc/PID/environ`` — and a network namespace with no interfaces but loopback.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import nearmiss

ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "JAX_PLATFORMS",
        "JAX_ENABLE_X64",
        "XLA_FLAGS",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_ALLOCATOR",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_HOME",
        "LD_LIBRARY_PATH",
        "TPU_VISIBLE_CHIPS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "TPU_PROCESS_BOUNDS",
        # Older OpenBLAS builds compute wrong results on some CPUs without these.
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "OMP_NUM_THREADS",
    }
)
SECRET_PATTERN = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|DSN|AUTH|COOKIE|SESSION|PRIVATE", re.IGNORECASE
)
# Where the engine's own packages live, so the child can import nearmiss without the venv's
# site-packages knowing about an uninstalled checkout.
PROJECT_ROOT = Path(nearmiss.__file__).resolve().parent.parent


def child_environment(
    home: Path, parent: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A scrubbed environment for a child whose private directory is ``home``."""
    parent = os.environ if parent is None else parent
    env = {
        name: value
        for name, value in parent.items()
        if name in ALLOWED_NAMES and not SECRET_PATTERN.search(name)
    }
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # Two children may share one accelerator; neither may grab most of its memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.update(
        HOME=str(home),
        TMPDIR=str(home),
        PYTHONPATH=str(PROJECT_ROOT),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONFAULTHANDLER="1",  # a segfault leaves the Python stack in the child's log
        PYTHONHASHSEED="0",
    )
    env.update(extra or {})
    return env


NAMESPACE_COMMAND = (
    "unshare",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    "--mount",
    "--net",
    "--ipc",
)


@functools.cache
def isolation_prefix() -> tuple[str, ...]:
    """The command prefix that puts a child in fresh namespaces, or () where that is refused."""
    if os.environ.get("NEARMISS_NO_NAMESPACES") == "1" or shutil.which("unshare") is None:
        return ()
    probe = subprocess.run([*NAMESPACE_COMMAND, "true"], capture_output=True, timeout=30)
    return NAMESPACE_COMMAND if probe.returncode == 0 else ()


def isolation_level() -> str:
    """'namespaces' when children get private PID/mount/network namespaces, else 'process'."""
    return "namespaces" if isolation_prefix() else "process"
