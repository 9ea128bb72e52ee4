"""Cheat (wrapper_compute): XLA computes the softmax; the pallas_call only copies it."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(x):
    y = jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype))(y)
