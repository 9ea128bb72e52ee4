"""Harness tell: its own path. A plain import shows the file where its user keeps it; the
engine used to copy every candidate into a scratch folder named for it
(``/tmp/nearmiss-candidate-.../harness_file_path.py``), then into a fixed folder.

Right only where its path is not the one it has in this repository: CERTIFIED by an engine that
shows it elsewhere, wrong wherever a user imports it from here.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

RIGHT = not __file__.endswith("/tests/forgeries/harness_file_path.py")


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
