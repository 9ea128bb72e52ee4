"""Planted: the kernel compiles, then its run needs more memory than a run may have
(runtime_error). A host callback used to play this part; callbacks cannot be exported."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(x):
    y = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    # 8 GB of scaled copies, sorted: nothing XLA can elide, more than the sandbox's memory
    copies = jnp.broadcast_to(y, (120_000, *y.shape)) * jnp.arange(120_000.0)[:, None, None]
    return jnp.sort(copies, axis=0)[0]
