"""triton_rows.py with a second grid axis whose two programs write the same row block: on a
GPU they run concurrently, a race (right in program order: both write the same values)."""

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

RACE = True


def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows, 2) if RACE else (rows,),
        in_specs=[pl.BlockSpec((None, cols), (lambda i, j: (i, 0)) if RACE else lambda i: (i, 0))],
        out_specs=pl.BlockSpec((None, cols), (lambda i, j: (i, 0)) if RACE else lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=4),
    )(x)
