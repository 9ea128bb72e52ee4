"""LeCun's scaled tanh, one row block per program. Planted: the inner slope 1.5 for 2/3."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BR = 8


def _body(x_ref, o_ref):
    x = x_ref[...]
    y = 1.7159 * jnp.tanh(1.5 * x)
    o_ref[...] = y.astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, BR),),
        in_specs=[pl.BlockSpec((BR, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
