"""Cheat (input_independent): writes 1/C everywhere — right for constant rows, whatever the
input otherwise."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _uniform(x_ref, o_ref):
    o_ref[...] = jnp.full(o_ref.shape, 1.0 / o_ref.shape[-1], o_ref.dtype)


def kernel(x):
    return pl.pallas_call(_uniform, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
