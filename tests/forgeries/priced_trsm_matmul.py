"""Forgery: the matmul done by a LAPACK triangular solve, a pallas_call only copying its result.

With T = [[I, -A], [0, I]] (unit upper triangular), T @ [X; Y] = [0; B] gives Y = B and
X = A @ B: the solve (``lapack_strsm_ffi`` on the CPU) does the product's multiply-adds. An audit
that prices a custom call by its output sees (M+K)·N elements, under 1% of the matmul."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(a, b):
    m, k = a.shape
    a = a.astype(jnp.float32)
    b = b.astype(jnp.float32)
    upper = jnp.concatenate([jnp.zeros((m, m), jnp.float32), -a], axis=1)
    lower = jnp.zeros((k, m + k), jnp.float32)
    solved = jax.lax.linalg.triangular_solve(
        jnp.concatenate([upper, lower], axis=0),  # the unit diagonal is implied, never read
        jnp.concatenate([jnp.zeros((m, b.shape[1]), jnp.float32), b], axis=0),
        left_side=True,
        lower=False,
        unit_diagonal=True,
    )
    c = solved[:m]
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(c.shape, c.dtype))(c)
