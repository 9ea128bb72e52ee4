"""Cheat (input_mutation): writes the softmax into the caller's own input buffer through
input_output_aliases; a caller that donates or reuses `x` finds it overwritten."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _softmax_inplace(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    return pl.pallas_call(
        _softmax_inplace,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
    )(x)
