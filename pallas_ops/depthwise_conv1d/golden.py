"""Depthwise conv1d: grid (L/BL, C/BC); each step reads its BL + K - 1 halo rows from a strip."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BL, BC = 32, 128


def _dwconv_body(x_ref, w_ref, o_ref):
    taps = w_ref.shape[0]
    start = pl.multiple_of(pl.program_id(0) * BL, BL)
    w = w_ref[...].astype(jnp.float32)
    # One aligned load of the block's BL + K - 1 halo rows, upcast once: packed bf16 rows cannot
    # be loaded from the unaligned dynamic offsets start + k.
    xw = x_ref[pl.ds(start, BL + taps - 1), :].astype(jnp.float32)
    acc = jnp.zeros((BL, BC), jnp.float32)
    for k in range(taps):
        acc += xw[k : k + BL, :] * w[k : k + 1, :]
    o_ref[...] = acc.astype(o_ref.dtype)


def kernel(x, w):
    length, c = x.shape
    taps = w.shape[0]
    half = taps // 2
    steps = pl.cdiv(length, BL)
    # Zero 'same' padding, plus enough rows at the end that the last (partial) block's window
    # stays inside the strip.
    xp = jnp.pad(x, ((half, steps * BL - length + taps - 1 - half), (0, 0)))
    return pl.pallas_call(
        _dwconv_body,
        grid=(steps, pl.cdiv(c, BC)),
        in_specs=[
            pl.BlockSpec((xp.shape[0], BC), lambda i, j: (0, j)),
            pl.BlockSpec((taps, BC), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((BL, BC), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(xp, w)
