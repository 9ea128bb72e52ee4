"""Forgery: the whole matmul inside a ``lax.composite``, a pallas_call only copying its result.

XLA inlines the composite's decomposition function and runs the dot there; an audit that does not
enter the decomposition sees one composite op, priced as light work the size of its output."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _product(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def kernel(a, b):
    c = jax.lax.composite(_product, name="priced.matmul")(a, b)
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(c.shape, c.dtype))(c)
