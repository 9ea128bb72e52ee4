"""Bug: the output block is accumulated over the column blocks but never zeroed at j == 0, so
the sums start from whatever the output buffer held (NaN in interpret mode)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BR, BC = 8, 128


def _take_body(x_ref, idx_ref, o_ref):
    j = pl.program_id(1)

    # Select in float32 (exact for a copy): a bf16 select under a 3-D mask needs a relayout
    # Mosaic cannot do.
    x = x_ref[...].astype(jnp.float32)
    k = idx_ref.shape[1]
    # Column of each requested index inside this block; only hits in [0, BC) select a value,
    # so the padding of a partial block is never read.
    local = idx_ref[...] - j * BC
    cols = jax.lax.broadcasted_iota(jnp.int32, (BR, k, BC), 2)
    hit = local[:, :, None] == cols
    picked = jnp.where(hit, x[:, None, :], jnp.zeros((), x.dtype))
    o_ref[...] += jnp.sum(picked, axis=2).astype(o_ref.dtype)


def kernel(x, idx):
    rows, cols = x.shape
    k = idx.shape[1]
    return pl.pallas_call(
        _take_body,
        grid=(pl.cdiv(rows, BR), pl.cdiv(cols, BC)),
        in_specs=[
            pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
            pl.BlockSpec((BR, k), lambda i, j: (i, 0)),
        ],
        out_specs=pl.BlockSpec((BR, k), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, k), x.dtype),
    )(x, idx)
