"""libtpu's environment for compile-only use, set in one place before JAX is imported.

libtpu is built for Cloud TPU VMs. Loaded on any other machine it looks for its workers and
accelerator type, writes log files and takes a machine-wide lock. Measured with libtpu 0.0.42 on
a CPU-only host, each setting below removes one of those (explicit settings in the environment
win: every value is a default):

- ``TPU_WORKER_HOSTNAMES=localhost``: without it libtpu fills the variable with a warning text,
  then prints ``WARNING: Logging before InitGoogle()`` and ``E0000 ... unexpected worker
  hostname 'WARNING: could not determine TPU worker hostnames...'`` to stderr.
- ``TPU_HOST_BOUNDS=1,1,1``: without it, ``Failed to find host bounds for accelerator type:
  WARNING: could not determine TPU accelerator type...`` on stderr. One host is also the truth
  for a single-device compile; the topologies (``v5e:2x2``...) are unaffected.
- ``TPU_SKIP_MDS_QUERY=1``: no queries to the GCE metadata server for the accelerator type
  (there is none, and a sandboxed child has no network). JAX sets it too, but only when its TPU
  backend initialises, which compile-only use never does.
- ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: libtpu otherwise takes ``/tmp/libtpu_lockfile`` for the
  whole machine, and a second process that loads it (another check's child, a test worker)
  fails with ``Internal error when accessing libtpu multi-process lockfile``. Compiling needs
  no exclusive access to a chip, and there is none to protect.
- ``TPU_MIN_LOG_LEVEL=3``, ``TPU_STDERR_LOG_LEVEL=3``: libtpu logs INFO/WARNING/ERROR into files
  under ``/tmp/tpu_logs`` (two to three files per process, more on every refused kernel). A
  refused kernel's message reaches us in the exception, so only FATAL is kept, and
  ``TPU_LOG_DIR`` points at this process's own temporary directory (a child's private home).
- ``JAX_PLATFORMS=cpu`` (``cpu_only``): with libtpu installed, JAX otherwise tries a TPU
  *backend* at start-up: it loads libtpu (VmPeak 2.1 GB instead of 0.5 GB, which matters under
  the children's address-space limit), takes the lock above and prints the noise above.
  Compile-only topologies do not need that backend.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import MutableMapping

COMPILE_ONLY_DEFAULTS = {
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
    "TPU_SKIP_MDS_QUERY": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_MIN_LOG_LEVEL": "3",
    "TPU_STDERR_LOG_LEVEL": "3",
}


def prepare_environment(
    environ: MutableMapping[str, str] | None = None, cpu_only: bool = True
) -> MutableMapping[str, str]:
    """Set libtpu's compile-only defaults in ``environ`` (``os.environ``) and return it.

    Call it before ``import jax`` (libtpu reads these when it is loaded; JAX reads
    ``JAX_PLATFORMS`` when its backends start). ``cpu_only``: JAX's only backend is the CPU (the
    default); pass False in a process that must also run on an attached accelerator.
    """
    env = os.environ if environ is None else environ
    for name, value in COMPILE_ONLY_DEFAULTS.items():
        env.setdefault(name, value)
    env.setdefault("TPU_LOG_DIR", env.get("TMPDIR") or tempfile.gettempdir())
    if cpu_only:
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env
