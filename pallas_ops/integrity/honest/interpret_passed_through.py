"""Honest: passes ``interpret=`` through, as JAX's own kernels do (a keyword argument handed to
``pl.pallas_call`` by ``functools.partial``). The engine owns the execution mode — it sets every
pallas_call's on the traced program — so this is a note in the integrity report, not a
violation, and the value passed changes nothing."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x, interpret=False):
    call = functools.partial(pl.pallas_call, interpret=interpret)
    return call(_softmax_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
