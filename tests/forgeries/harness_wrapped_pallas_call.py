"""Harness tell: JAX's own ``pallas_call``. The engine used to replace it by a labelling wrapper
(``functools.wraps`` over JAX's function, itself a wrapper): one ``__wrapped__`` too many.

Right only when ``pallas_call`` is wrapped twice: CERTIFIED by an engine that wraps it, wrong
wherever JAX is imported as it ships.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

RIGHT = hasattr(pl.pallas_call.__wrapped__, "__wrapped__")


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
