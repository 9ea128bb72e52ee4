"""Planted: the output has the transposed shape (shape_mismatch)."""

import jax
from jax.experimental import pallas as pl


def _softmax_t(x_ref, o_ref):
    x = x_ref[...]
    e = jax.numpy.exp(x - x.max(axis=-1, keepdims=True))
    o_ref[...] = (e / e.sum(axis=-1, keepdims=True)).T


def kernel(x):
    return pl.pallas_call(_softmax_t, out_shape=jax.ShapeDtypeStruct(x.shape[::-1], x.dtype))(x)
