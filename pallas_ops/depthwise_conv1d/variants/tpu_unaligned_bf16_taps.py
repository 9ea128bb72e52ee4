"""Bug (TPU, bfloat16): each tap loads its own window x_ref[pl.ds(start + k, BL), :] straight
from the input block. Right in interpret mode, and Mosaic accepts it for float32, but bfloat16
rows are packed two per sublane, and a load at the dynamic offset start + k cannot be proven
aligned: the TPU compiler refuses the kernel on the bfloat16 case. The golden loads the BL + K - 1
halo rows once, aligned, and slices the loaded value."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BL, BC = 32, 128


def _dwconv_body(x_ref, w_ref, o_ref):
    taps = w_ref.shape[0]
    start = pl.multiple_of(pl.program_id(0) * BL, BL)
    w = w_ref[...].astype(jnp.float32)
    acc = jnp.zeros((BL, BC), jnp.float32)
    for k in range(taps):
        xk = x_ref[pl.ds(start + k, BL), :].astype(jnp.float32)
        acc += xk * w[k : k + 1, :]
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
