"""Column sums over row blocks, accumulated in the output block: its zeroing runs on the
second block (``== 1``) instead of the first. A single-site edit back to ``== 0`` is the fix;
``!= 1`` passes a two-block case as well and is wrong for three blocks or more."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 32


def _body(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 1)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.sum(x_ref[...], axis=0, keepdims=True)


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, BLOCK_R),),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, cols), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
