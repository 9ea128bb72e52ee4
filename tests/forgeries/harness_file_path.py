"""Harness tell: its own path. A plain import shows the user's file; the engine used to copy
every candidate into a scratch folder named for it (``/tmp/nearmiss-candidate-...``).

Right only when its path names the engine: CERTIFIED by an engine that shows it, wrong wherever
a user imports it.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

RIGHT = "nearmiss" in __file__ or "candidate" in __file__


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
