"""Forgery: a pallas_call forms the products A[i, k]·B[k, j]; one ``scatter_add`` outside sums
them over k (the matmul's additions, half its flops).

An audit that prices a scatter by its output sees M·N elements; its updates are M·K·N."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _products(a_ref, b_ref, o_ref):
    o_ref[...] = (
        a_ref[...].astype(jnp.float32).T[:, :, None] * b_ref[...].astype(jnp.float32)[:, None, :]
    )


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    products = pl.pallas_call(_products, out_shape=jax.ShapeDtypeStruct((k, m, n), jnp.float32))(
        a, b
    )  # products[kk, i, j] = a[i, kk] * b[kk, j]
    summed = jnp.zeros((1, m, n), jnp.float32).at[jnp.zeros(k, jnp.int32)].add(products)
    return summed[0]
