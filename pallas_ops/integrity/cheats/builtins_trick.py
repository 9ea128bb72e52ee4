"""Cheat (forbidden_import): digs `open` out of the builtins to read the reference's files."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_read = getattr(__builtins__, "open", None) if hasattr(__builtins__, "open") else None


def kernel(a, b):
    def body(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    shape = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    return pl.pallas_call(body, out_shape=shape)(a, b)
