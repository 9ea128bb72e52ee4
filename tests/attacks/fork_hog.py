"""Attack: leave processes behind that grow once the candidate child has answered — while the
engine waits on its other children and watches none of this one — and answer correctly. Each
stays under the address-space limit a child has; together they pass the memory limit. Before
the cgroup per child this was certified with 3 GB held against a 2 GB limit."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
sys = load("sys")
TARGETS = {}  # the test writes {"hogs": N, "mb": each one's size, "after_s": when} here
GROW = """
import time
time.sleep({after_s})
grown = [bytearray(16 * 1024 * 1024) for _ in range({mb} // 16)]
for block in grown:
    block[::4096] = b"\\x01" * len(block[::4096])  # touch every page: resident
time.sleep(3600)
"""

for _ in range(TARGETS.get("hogs", 3)):
    if os.fork() == 0:
        try:  # a fresh interpreter: a fork of this one has JAX's address space already
            code = GROW.format(after_s=TARGETS.get("after_s", 1.0), mb=TARGETS.get("mb", 512))
            os.execv(sys.executable, [sys.executable, "-c", code])
        finally:
            os._exit(0)


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
