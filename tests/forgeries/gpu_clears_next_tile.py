"""A column sum whose programs race on a GPU though every CPU run is right: as
``tests/planted/gpu_col_sum_whole_block.py`` (the output has no BlockSpec: every program's
block is the whole array, each stores its own columns through a mask), but each program also
clears the next program's columns first. Run in order, the next program overwrites the zeros;
run concurrently, as a GPU runs its programs, the zeros can land after its sums.
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
        zeros = jnp.zeros_like(total)
        pltriton.store(
            o_ref.at[:, pl.ds(start + BLOCK_C, BLOCK_C)], zeros, mask=col + BLOCK_C < cols
        )
        pltriton.store(o_ref.at[:, pl.ds(start, BLOCK_C)], total, mask=col < cols)

    sums = pl.pallas_call(
        body,
        grid=(pl.cdiv(cols, BLOCK_C),),
        in_specs=[pl.BlockSpec((block_r, BLOCK_C), lambda j: (0, j))],
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
