"""Bug: exp(x) is summed without subtracting the row max first; large logits overflow exp to
inf (and log(inf) = inf), while N(0, 1) inputs pass."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8


def _logsumexp_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    s = jnp.sum(jnp.exp(x), axis=-1)
    o_ref[...] = jnp.log(s).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _logsumexp_body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R,), lambda i: (i,)),
        out_shape=jax.ShapeDtypeStruct((rows,), x.dtype),
    )(x)
