"""Forgery: the matmul done in plain XLA by a while loop whose trip count is data (carried in
the loop), one output element per turn, so that every op in its body works on a few scalars;
the pallas_call only copies the product.

A loop of unknown trip count was flagged only where one of its ops worked on 256 elements or
more per turn: this one's work was never counted, and it was certified.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def _copy(c_ref, o_ref):
    o_ref[...] = c_ref[...]


def kernel(a, b):
    m, _ = a.shape
    n = b.shape[1]

    def turn(state):
        i, count, out = state
        row, col = i // n, i % n
        a_row = lax.dynamic_slice_in_dim(a, row, 1, axis=0)
        b_col = lax.dynamic_slice_in_dim(b, col, 1, axis=1)
        value = jnp.sum(a_row[0].astype(jnp.float32) * b_col[:, 0].astype(jnp.float32))
        return i + 1, count, lax.dynamic_update_slice(out, value.reshape(1, 1), (row, col))

    state = (jnp.int32(0), jnp.int32(m * n), jnp.zeros((m, n), jnp.float32))
    _, _, product = lax.while_loop(lambda s: s[0] < s[1], turn, state)
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(product.shape, jnp.float32))(
        product
    )
