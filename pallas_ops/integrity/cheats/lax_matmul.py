"""Cheat (no_pallas_call): the matmul is a plain lax.dot_general; Pallas never appears."""

import jax
import jax.numpy as jnp


def kernel(a, b):
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
