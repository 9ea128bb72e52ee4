"""Bug (TPU, bfloat16): each of the 9 taps loads its own shifted window
x_ref[:, pl.ds(start + dy, BH), dx : dx + width] straight from the input block. Right in
interpret mode, but bfloat16 rows are packed two per sublane, and loads at the dynamic offsets
start + dy cannot be proven aligned: the TPU compiler refuses the kernel on the bfloat16 case.
The golden loads the BH + 2 halo rows once, aligned, and slices the loaded value."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BH = 8


def _conv_body(x_ref, w_ref, o_ref):
    c_out, bh, width = o_ref.shape
    start = pl.multiple_of(pl.program_id(0) * BH, BH)
    w = w_ref[...].astype(jnp.float32)
    acc = jnp.zeros((c_out, bh, width), jnp.float32)
    for dy in range(3):
        for dx in range(3):
            xs = x_ref[:, pl.ds(start + dy, BH), dx : dx + width].astype(jnp.float32)
            tap = w[:, :, dy, dx]  # (Cout, Cin)
            # Contract the input channels: (Cout, Cin, 1, 1) * (1, Cin, BH, W) summed over Cin.
            acc += jnp.sum(tap[:, :, None, None] * xs[None], axis=1)
    o_ref[...] = acc.astype(o_ref.dtype)


def kernel(x, w):
    c_in, h, width = x.shape
    c_out = w.shape[0]
    steps = pl.cdiv(h, BH)
    # 'same' padding of one pixel, plus rows at the bottom so the last block's window fits.
    xp = jnp.pad(x, ((0, 0), (1, steps * BH - h + 1), (1, 1)))
    return pl.pallas_call(
        _conv_body,
        grid=(steps,),
        in_specs=[
            pl.BlockSpec(xp.shape, lambda i: (0, 0, 0)),
            pl.BlockSpec(w.shape, lambda i: (0, 0, 0, 0)),
        ],
        out_specs=pl.BlockSpec((c_out, BH, width), lambda i: (0, i, 0)),
        out_shape=jax.ShapeDtypeStruct((c_out, h, width), x.dtype),
    )(xp, w)
