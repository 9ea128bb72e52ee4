"""Planted (float32 throughout): the normaliser's sum skips the last column, a mask off by one.
Every output is a little too large — by e[last] / sum, about 1/C — and the rows differ, so no
constant factor explains it: small errors spread over the whole output, like rounding noise.
With no type narrower than float32 anywhere in the kernel, that is not precision."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    x = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x)
    cols = jax.lax.broadcasted_iota(jnp.int32, e.shape, 1)
    kept = jnp.where(cols < e.shape[-1] - 1, e, 0.0)  # off by one: drops the last column
    o_ref[...] = (e / jnp.sum(kept, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _softmax_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
