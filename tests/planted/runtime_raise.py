"""Planted: the kernel compiles, then a host callback raises while it runs (runtime_error)."""

import jax
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _explode(x):
    raise RuntimeError("device buffer check failed")


def kernel(x):
    y = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return jax.pure_callback(_explode, jax.ShapeDtypeStruct(x.shape, x.dtype), y)
