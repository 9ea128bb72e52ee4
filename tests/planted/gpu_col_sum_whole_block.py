"""A column sum written Triton-style: the output has no BlockSpec, so every program's block is
the whole array, and each program stores its own 128 columns through a mask
(``pltriton.store(o_ref.at[:, pl.ds(...)], ..., mask=)``). One block, disjoint elements: no race
on a GPU, and certified for ``gpu``. ``tests/forgeries/gpu_clears_next_tile.py`` is the same
kernel that also clears its neighbour's columns: a race.
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
        start = pl.program_id(0) * BLOCK_C
        col = start + jax.lax.broadcasted_iota(jnp.int32, total.shape, 1)
        pltriton.store(o_ref.at[:, pl.ds(start, BLOCK_C)], total, mask=col < cols)

    sums = pl.pallas_call(
        body,
        grid=(pl.cdiv(cols, BLOCK_C),),
        in_specs=[pl.BlockSpec((block_r, BLOCK_C), lambda j: (0, j))],
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
