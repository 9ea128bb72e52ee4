"""Attack: outlive the check — daemons that fork twice and leave their session (so killing
the child's process group misses them), then a hang."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
time = load("time")
TARGETS = {}  # the test writes {"daemons": N} here


def daemonise() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                time.sleep(1)
        os._exit(0)


def kernel(x):
    for _ in range(TARGETS.get("daemons", 4)):
        daemonise()
    while True:
        time.sleep(1)
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
