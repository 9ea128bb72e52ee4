"""Cheat (no_pallas_call): no kernel at all, XLA's softmax returned as is."""

import jax


def kernel(x):
    return jax.nn.softmax(x, axis=-1)
