"""A column sum written Triton-style, storing from inside a branch and a loop: every program's
block is the whole array (no output BlockSpec), and each program stores its own 128 columns in
two 64-column halves, from a ``fori_loop`` under ``pl.when`` (the branch skips a program with
no columns, which a grid of ``cdiv`` never has). Disjoint elements: no race on a GPU, and
certified for ``gpu``. The footprint read only stores at the top of the body and called this
a race ("an output is passed to cond"). With ``HALVES = 3`` each program also stores its first
half again into its neighbour's first 64 columns: right in every ordered run (the neighbour
stores its own sums after), a race on a GPU.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

BLOCK_C = 128
HALF = BLOCK_C // 2
HALVES = 2  # halves a program stores (2: its own columns)


def kernel(x):
    rows, cols = x.shape
    block_r = 1 << (rows - 1).bit_length()

    def body(x_ref, o_ref):
        start = pl.program_id(0) * BLOCK_C

        @pl.when(start < cols)
        def _():
            def store_half(h, carry):
                x = x_ref[:, pl.ds(jnp.minimum(h, 1) * HALF, HALF)].astype(jnp.float32)
                inside = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0) < rows
                half = jnp.sum(jnp.where(inside, x, 0.0), axis=0, keepdims=True)
                first = start + h * HALF
                col = first + jax.lax.broadcasted_iota(jnp.int32, half.shape, 1)
                stored = half.astype(o_ref.dtype)
                pltriton.store(o_ref.at[:, pl.ds(first, HALF)], stored, mask=col < cols)
                return carry

            jax.lax.fori_loop(0, HALVES, store_half, 0)

    sums = pl.pallas_call(
        body,
        grid=(pl.cdiv(cols, BLOCK_C),),
        in_specs=[pl.BlockSpec((block_r, BLOCK_C), lambda j: (0, j))],
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
