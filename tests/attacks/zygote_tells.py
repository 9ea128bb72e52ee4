"""Attack: tell a child forked from a zygote from a fresh one by what an import can see without
the operating system — the modules loaded, numpy's global generator — and say it (briefly: a
check keeps 300 characters of an error's message)."""

import sys
import zlib

import jax
import numpy as np

TARGETS = {}


def kernel(x):
    modules = sorted(sys.modules)
    raise RuntimeError(
        f"ATTACK modules={zlib.crc32(' '.join(modules).encode())} count={len(modules)} "
        f"numpy={np.random.randint(1 << 30)}"
    )
    return jax.nn.softmax(x)
