"""Cheat (wrapper_compute, in a loop): XLA computes the softmax one row per iteration of a
while_loop whose trip count depends on the data; the pallas_call only copies the result."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(x):
    rows = jnp.sum(jnp.ones_like(x[:, 0], jnp.int32))  # x.shape[0], but only known at run time

    def body(state):
        i, out = state
        row = jax.lax.dynamic_slice_in_dim(x, i, 1).astype(jnp.float32)
        e = jnp.exp(row - jnp.max(row))
        return i + 1, jax.lax.dynamic_update_slice_in_dim(
            out, (e / jnp.sum(e)).astype(x.dtype), i, 0
        )

    _, y = jax.lax.while_loop(lambda s: s[0] < rows, body, (0, jnp.zeros_like(x)))
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype))(y)
