"""One BLAS thread for the engine's processes, unless the user's environment names another.

NumPy's OpenBLAS starts a thread per core when it is loaded, and they spin: about 0.1 CPU-s of a
fresh JAX process's 0.5 on two cores, paid again by every child a check starts. The engine's
processes do no BLAS work worth a thread (JAX's CPU backend computes with pools of its own, and
the engine's own arrays are small), so each one asks for one thread before NumPy loads: the
sandbox's children in their environment (``environment.child_environment``), the command line
as it starts (``nearmiss.cli``). A matrix product comes out the same on one thread (OpenBLAS
splits its rows and columns across threads, not its sums); only a long vector dot product may
round differently, and no check's verdict rests on NumPy's.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VARIABLE = "OPENBLAS_NUM_THREADS"


def one_blas_thread(env: MutableMapping[str, str] = os.environ) -> None:
    """Ask for one OpenBLAS thread in ``env`` (the process's own by default: only before NumPy
    is imported does it count), unless it already names a number."""
    env.setdefault(VARIABLE, "1")
