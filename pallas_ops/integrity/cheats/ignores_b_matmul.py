"""Cheat (input_independent): never reads `b`; multiplies by a fixed pattern instead."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _body(a_ref, b_ref, o_ref):
    k, n = b_ref.shape
    pattern = (jax.lax.broadcasted_iota(jnp.int32, (k, n), 0) % 3 - 1).astype(jnp.float32)
    o_ref[...] = jnp.dot(a_ref[...].astype(jnp.float32), pattern)


def kernel(a, b):
    shape = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    return pl.pallas_call(_body, out_shape=shape)(a, b)
