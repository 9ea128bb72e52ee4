"""Harness tell: its own module name. A plain ``import harness_module_name`` names the module
after its file; the engine used to import every candidate as ``nearmiss_candidate``.

Right (softmax) only when its name is not its file's stem: CERTIFIED by an engine that renames
it, wrong (every row off by 1 %) wherever a user imports it.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

RIGHT = __name__ != "harness_module_name"


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
