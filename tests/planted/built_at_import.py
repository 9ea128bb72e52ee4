"""Planted: the pallas_call is built when the module is imported (interpret must still apply)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _softmax(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


@functools.cache
def _build(shape, dtype):
    return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(shape, dtype))


_PREBUILT = _build((64, 256), jnp.dtype("float32"))


def kernel(x):
    call = _PREBUILT if x.shape == (64, 256) else _build(x.shape, x.dtype)
    return call(x)
