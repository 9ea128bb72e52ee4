"""Bug (TPU): the (BR, 1) carry is allocated in `pl.ANY` memory. Right in interpret mode, where
every memory space is plain memory, but on TPU `pl.ANY` leaves the buffer in HBM, and Mosaic only
loads and stores VMEM and SMEM refs: the compiler refuses `carry_ref[...]`."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BR, BC = 8, 128


def _cumsum_body(x_ref, o_ref, carry_ref, *, cols):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _reset():
        carry_ref[...] = jnp.zeros_like(carry_ref)

    # Zero the columns past the edge: the padding of a partial block is garbage, and 0 * NaN
    # in the triangular product would poison every column of the block.
    col = j * BC + jax.lax.broadcasted_iota(jnp.int32, (BR, BC), 1)
    x = jnp.where(col < cols, x_ref[...].astype(jnp.float32), 0.0)
    # In-block inclusive prefix sum as a product with an upper-triangular matrix of ones.
    k = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 0)
    c = jax.lax.broadcasted_iota(jnp.int32, (BC, BC), 1)
    tri = (k <= c).astype(jnp.float32)
    local = jnp.dot(x, tri, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    out = local + carry_ref[...]
    o_ref[...] = out.astype(o_ref.dtype)
    carry_ref[...] = out[:, BC - 1 :]


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_cumsum_body, cols=cols),
        grid=(pl.cdiv(rows, BR), pl.cdiv(cols, BC)),
        in_specs=[pl.BlockSpec((BR, BC), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pl.ANY((BR, 1), jnp.float32)],
    )(x)
