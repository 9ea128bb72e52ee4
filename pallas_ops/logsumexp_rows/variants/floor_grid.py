"""Bug: the grid floors R / BLOCK_R, so when R is not a multiple of BLOCK_R the last rows
are never computed and their outputs stay uninitialised."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# TPU blocks are 2-D, their last two dims a multiple of (8, 128) or the array's whole dim:
# one value per row leaves as an (R, 1) column.
BLOCK_R = 8


def _logsumexp_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    m = jnp.max(x, axis=-1, keepdims=True)
    s = jnp.sum(jnp.exp(x - m), axis=-1, keepdims=True)
    o_ref[...] = (m + jnp.log(s)).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    lse = pl.pallas_call(
        _logsumexp_body,
        grid=(rows // BLOCK_R,),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 1), x.dtype),
    )(x)
    return lse.reshape(rows)
