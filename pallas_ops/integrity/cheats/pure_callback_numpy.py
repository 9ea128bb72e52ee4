"""Cheat (host_callback): NumPy on the host computes the softmax through jax.pure_callback."""

import jax
import numpy as np
from jax.experimental import pallas as pl


def _host_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(x):
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    y = jax.pure_callback(_host_softmax, shape, x)
    return pl.pallas_call(_copy, out_shape=shape)(y)
