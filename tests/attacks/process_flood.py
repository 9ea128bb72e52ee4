"""Attack: start processes without end (each sleeps, so nothing is busy), keep going past every
failure, then answer correctly. Before the cgroup per child this was certified with 1,504
processes in one sandbox (RLIMIT_NPROC does not bind: the sandbox's uid is the engine's)."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
time = load("time")
TARGETS = {}  # the test writes {"processes": how many to try} here

started = 0
for _ in range(TARGETS.get("processes", 64)):
    try:
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        started += 1
    except OSError:
        pass
print(f"ATTACK started={started}", flush=True)


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
