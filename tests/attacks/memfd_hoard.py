"""Attack: hold memory no process maps — memfds written through, never mapped, so no resident
size shows them — then answer correctly. Before the cgroup per child this was certified with
4.6 GB held against a 4 GB limit."""

import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

load = typing.sys.modules["importlib"].import_module
os = load("os")
TARGETS = {}  # the test writes {"mb": how much to hold} here
CHUNK = b"\xa5" * (16 * 1024 * 1024)
held = []


def hoard(mb: int) -> None:
    """In memfds of 512 MB (a child's files are limited to 2 GB each)."""
    for index in range(mb // 16):
        if index % 32 == 0:
            held.append(os.memfd_create("hoard"))
        os.pwrite(held[-1], CHUNK, (index % 32) * len(CHUNK))


hoard(TARGETS.get("mb", 512))


def kernel(x):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
