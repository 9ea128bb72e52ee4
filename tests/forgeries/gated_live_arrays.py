"""Harness tell the static gate refuses: ``jax.live_arrays()`` while the kernel is traced. A
user's ``jax.jit(kernel)(x)`` holds ``x`` alive then; the engine traces shapes, and holds none.

Right only where no array of the input's shape is alive: right under the engine, wrong (every
row off by 1 %) wherever a user calls it on an array. The harness cannot hide this (an array
it kept alive for the trace would hand the kernel values), so the gate refuses the question.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

RIGHT = True


def _body(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True) * (1.0 if RIGHT else 1.01)


def kernel(x):
    global RIGHT
    RIGHT = not any(a.shape == x.shape for a in jax.live_arrays())
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(rows, 8),),
        in_specs=[pl.BlockSpec((8, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
