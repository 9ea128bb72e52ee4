"""Bug (GPU): the input channels are split across a second grid axis, (H/BH, Cin), as a tiled
matmul splits K: each step adds one channel's 9 taps into a float32 scratch accumulator, and the
last one stores the output block. Right in interpret mode, and on TPU, whose grid runs in order,
but GPU grid programs run concurrently, each with its own scratch: the Cin programs of one row
block race on the same output block. The golden contracts every input channel inside one
program."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BH = 8


def _conv_body(x_ref, w_ref, o_ref, acc_ref):
    c_out, bh, width = o_ref.shape
    start = pl.multiple_of(pl.program_id(0) * BH, BH)
    c = pl.program_id(1)

    @pl.when(c == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = w_ref[...].astype(jnp.float32)
    # One aligned load of the BH + 2 rows (with the halo) the 9 windows cover, upcast once:
    # packed bf16 rows cannot be loaded from the unaligned dynamic offsets start + dy.
    xw = x_ref[:, pl.ds(start, BH + 2), :].astype(jnp.float32)
    acc = acc_ref[...]
    for dy in range(3):
        for dx in range(3):
            xs = xw[:, dy : dy + BH, dx : dx + width]
            tap = w[:, :, dy, dx]  # (Cout, Cin)
            # Contract the input channels: (Cout, Cin, 1, 1) * (1, Cin, BH, W) summed over Cin.
            acc += jnp.sum(tap[:, :, None, None] * xs[None], axis=1)
    acc_ref[...] = acc

    @pl.when(c == pl.num_programs(1) - 1)
    def _store():
        o_ref[...] = acc.astype(o_ref.dtype)


def kernel(x, w):
    c_in, h, width = x.shape
    c_out = w.shape[0]
    steps = pl.cdiv(h, BH)
    # 'same' padding of one pixel, plus rows at the bottom so the last block's window fits.
    xp = jnp.pad(x, ((0, 0), (1, steps * BH - h + 1), (1, 1)))
    return pl.pallas_call(
        _conv_body,
        grid=(steps, c_in),
        in_specs=[
            pl.BlockSpec((1, *xp.shape[1:]), lambda i, c: (c, 0, 0)),
            pl.BlockSpec((c_out, 1, 3, 3), lambda i, c: (0, c, 0, 0)),
        ],
        out_specs=pl.BlockSpec((c_out, BH, width), lambda i, c: (0, i, 0)),
        out_shape=jax.ShapeDtypeStruct((c_out, h, width), x.dtype),
        scratch_shapes=[pltpu.VMEM((c_out, BH, width), jnp.float32)],
    )(xp, w)
