"""Forgery: the matmul in plain XLA, inside a jitted function named like the engine's kernel
label and shaped like interpret mode's kernels (a loop at its top: one counted step); the
pallas_call only copies the product.

While the label was a constant the audit took that function for a kernel, and the XLA matmul
for the kernel's own work: certified. Each check now draws its label's suffix after the trace.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def _copy(c_ref, o_ref):
    o_ref[...] = c_ref[...]


def nearmiss_pallas_kernel(a, b):
    zero = jnp.zeros((a.shape[0], b.shape[1]), jnp.float32)
    return lax.fori_loop(0, 1, lambda i, acc: acc + jnp.dot(a, b, precision="highest"), zero)


def kernel(a, b):
    product = jax.jit(nearmiss_pallas_kernel)(a, b)
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(product.shape, jnp.float32))(
        product
    )
