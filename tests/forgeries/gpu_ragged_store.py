"""Target forgery (gpu): a ragged last output block stored whole, right wherever a store past
the array's end is dropped.

A GPU-shaped column sum (each program owns a column block and sums every row inside it, the
rows past the array's end masked by their index: right with any fill) whose 128-column blocks
run past the end of a 300-column array. Both interpret modes drop what the last program stores
past the end; Pallas' Triton lowering stores a block whole, unmasked, so on a GPU that program
writes 84 floats past the output, into whatever memory follows it. It was certified for gpu
until the Triton lowering's reading held each store of a ragged output block to a mask
(``targets.triton.unmasked_store_past_the_end``).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_C = 128


def kernel(x):
    rows, cols = x.shape
    block_r = 1 << (rows - 1).bit_length()  # a power of two, at least the row count

    def body(x_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        inside = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0) < rows
        x = jnp.where(inside, x, 0.0)
        o_ref[...] = jnp.sum(x, axis=0, keepdims=True).astype(o_ref.dtype)

    sums = pl.pallas_call(
        body,
        grid=(pl.cdiv(cols, BLOCK_C),),
        in_specs=[pl.BlockSpec((block_r, BLOCK_C), lambda j: (0, j))],
        out_specs=pl.BlockSpec((1, BLOCK_C), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), x.dtype),
    )(x)
    return sums.reshape(cols)
