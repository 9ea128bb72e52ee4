"""Honest glue: views the rows as (1, R, C) for a 3-D kernel, then reshapes back."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    x3 = x.reshape(1, rows, cols)
    out = pl.pallas_call(
        _softmax_body,
        grid=(rows,),
        in_specs=[pl.BlockSpec((1, 1, cols), lambda i: (0, i, 0))],
        out_specs=pl.BlockSpec((1, 1, cols), lambda i: (0, i, 0)),
        out_shape=jax.ShapeDtypeStruct(x3.shape, x.dtype),
    )(x3)
    return out.reshape(rows, cols)
