"""Forgery: plain XLA under the name the engine gives kernels, hoping a label is a kernel."""

import jax


def nearmiss_pallas_kernel(x):
    return jax.nn.softmax(x, axis=-1)


kernel = jax.jit(nearmiss_pallas_kernel)
