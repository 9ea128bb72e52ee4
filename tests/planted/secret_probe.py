"""Planted: a correct softmax that poisons its output with NaN if it can see a planted secret.

It looks in its own environment and, where it can, in every other process's environment
through /proc — where a sandbox without its own PID namespace would let it.
"""

import glob
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

MARKER = "planted-marker-7731"


def _visible() -> bool:
    if any(MARKER in value for value in os.environ.values()):
        return True
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as handle:
                if MARKER.encode() in handle.read():
                    return True
        except OSError:
            continue
    return False


SEEN = _visible()


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def kernel(x):
    out = pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return out * jnp.nan if SEEN else out
