"""A column sum written for a GPU, right there on every shape the col_sum spec allows: each
program owns a 128-column block and sums every row inside it (no grid race), the row block is
the row count rounded up to a power of two (Triton's rule) with the rows past the end masked by
their index, and the last, ragged column block is stored through a mask of the columns inside
the array (``pltriton.store``), as Pallas' Triton lowering needs: it stores a block whole
otherwise. Certified for ``gpu`` on a CPU host; ``tests/forgeries/gpu_ragged_store.py`` is the
same kernel with a plain store.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

BLOCK_C = 128


def kernel(x):
    rows, cols = x.shape
    block_r = 1 << (rows - 1).bit_length()

    def body(x_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        inside = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0) < rows
        x = jnp.where(inside, x, 0.0)
        total = jnp.sum(x, axis=0, keepdims=True).astype(o_ref.dtype)
        col = pl.program_id(0) * BLOCK_C + jax.lax.broadcasted_iota(jnp.int32, total.shape, 1)
        pltriton.store(o_ref, total, mask=col < cols)

    sums = pl.pallas_call(
        body,
        grid=(pl.cdiv(cols, BLOCK_C),),
        in_specs=[pl.BlockSpec((block_r, BLOCK_C), lambda j: (0, j))],
        out_specs=pl.BlockSpec((1, BLOCK_C), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
