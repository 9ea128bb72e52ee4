"""Cheat (host_callback, disguised): the callback is bound to an innocent name, so only the
traced program shows it; the host computes the matmul."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

_host = jax.pure_callback


def _host_matmul(a, b):
    return np.asarray(a, np.float32) @ np.asarray(b, np.float32)


def _copy(c_ref, o_ref):
    o_ref[...] = c_ref[...]


def kernel(a, b):
    shape = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    c = _host(_host_matmul, shape, a, b)
    return pl.pallas_call(_copy, out_shape=shape)(c)
