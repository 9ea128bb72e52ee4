"""Embedding gather: grid (N/BN, D/BD); each step copies BN table rows, one dynamic load per id."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BN, BD = 16, 128


def _gather_body(ids_ref, table_ref, o_ref, *, n):
    base = pl.program_id(0) * BN
    # Each table row is its own (1, BD) tile, so an id indexes the untiled leading dim: no
    # dynamic sublane offset into the (packed, for bf16) rows. Ids past the end of a partial
    # last block are padding: read the last id's row for them instead.
    rows = [table_ref[ids_ref[jnp.minimum(base + k, n - 1)]] for k in range(BN)]
    o_ref[...] = jnp.concatenate(rows, axis=0)


def kernel(table, ids):
    v, d = table.shape
    n = ids.shape[0]
    return pl.pallas_call(
        functools.partial(_gather_body, n=n),
        grid=(pl.cdiv(n, BN), pl.cdiv(d, BD)),
        in_specs=[
            # The ids are scalars the body indexes with: the whole (N,) array sits in SMEM.
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec((v, 1, BD), lambda i, j: (0, 0, j)),
        ],
        out_specs=pl.BlockSpec((BN, BD), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, d), table.dtype),
    )(ids, table.reshape(v, 1, d))
