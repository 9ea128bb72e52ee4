"""Bug: tanh is hand-written as (e^2y - 1) / (e^2y + 1); for |x| > ~44 * CAP the exponential
overflows and inf / inf gives NaN where the capped logit is +-CAP (normal inputs pass)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R, BLOCK_C = 32, 128
CAP = 30.0


def _softcap_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(2.0 * (x / CAP))
    y = CAP * (e - 1.0) / (e + 1.0)
    o_ref[...] = y.astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    spec = pl.BlockSpec((BLOCK_R, BLOCK_C), lambda i, j: (i, j))
    return pl.pallas_call(
        _softcap_body,
        grid=(pl.cdiv(rows, BLOCK_R), pl.cdiv(cols, BLOCK_C)),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
