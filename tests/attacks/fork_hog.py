"""Attack: start processes that each stay under a child's address-space limit but together pass
its memory limit, then answer correctly once they have grown. Before the cgroup per child,
processes like these that grew while the engine waited on another child (and so watched none of
this one) were certified with 3 GB held against a 2 GB limit; these grow before the answer, so
the test holds the kernel's limit in place without depending on when the engine looks."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
sys = load("sys")
time = load("time")
TARGETS = {}  # the test writes {"hogs": N, "mb": each one's size} here
GROW = """
grown = [bytearray(16 * 1024 * 1024) for _ in range({mb} // 16)]
for block in grown:
    block[::4096] = b"\\x01" * len(block[::4096])  # touch every page: resident
open("grown-{index}", "w").close()
import time
time.sleep(3600)
"""

hogs = []
for index in range(TARGETS.get("hogs", 3)):
    pid = os.fork()
    if pid == 0:
        try:  # a fresh interpreter: a fork of this one has JAX's address space already
            code = GROW.format(mb=TARGETS.get("mb", 512), index=index)
            os.execv(sys.executable, [sys.executable, "-c", code])
        finally:
            os._exit(0)
    hogs.append(pid)

# Answer only once every hog has grown or been stopped, so the check never outruns them.
waiting, deadline = dict(enumerate(hogs)), time.monotonic() + 60
while waiting and time.monotonic() < deadline:
    for index, pid in list(waiting.items()):
        if os.path.exists(f"grown-{index}") or os.waitpid(pid, os.WNOHANG)[0] == pid:
            del waiting[index]
    time.sleep(0.05)


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
