"""Harness tell, through JAX's public API alone: the execution mode a ``pallas_call`` is traced
with. The engine used to set JAX's interpret flag for the whole process before the import, and
a jaxpr prints the mode each kernel was built with.

Right only when a kernel built without ``interpret=`` traces as interpreted: CERTIFIED by an
engine that sets the flag, wrong on every TPU and GPU (and wherever the flag is unset).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


_PROBE = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
RIGHT = "interpret=True" in str(jax.make_jaxpr(_PROBE)(jnp.zeros((8, 128), jnp.float32)))


def _body(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True) * (1.0 if RIGHT else 1.01)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, 8),),
        in_specs=[pl.BlockSpec((8, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
