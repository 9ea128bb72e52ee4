"""Embedding gather: grid (N/BN, D/BD); each step copies BN table rows, one dynamic load per id."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BN, BD = 16, 128


def _gather_body(ids_ref, table_ref, o_ref, *, n):
    base = pl.program_id(0) * BN

    def copy_row(k, carry):
        # Ids past the end of a partial last block are padding: read row 0 for them instead.
        row = jnp.where(base + k < n, ids_ref[k], 0)
        o_ref[pl.ds(k, 1), :] = table_ref[pl.ds(row, 1), :]
        return carry

    jax.lax.fori_loop(0, BN, copy_row, 0)


def kernel(table, ids):
    v, d = table.shape
    n = ids.shape[0]
    return pl.pallas_call(
        functools.partial(_gather_body, n=n),
        grid=(pl.cdiv(n, BN), pl.cdiv(d, BD)),
        in_specs=[
            pl.BlockSpec((BN,), lambda i, j: (i,)),
            pl.BlockSpec((v, BD), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((BN, BD), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, d), table.dtype),
    )(ids, table)
