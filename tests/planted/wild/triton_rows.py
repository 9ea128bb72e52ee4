"""Doubles its input row by row in the style of JAX's Triton kernels (ops/gpu): one program per
row, a squeezed row block (None, C) that TPU tiling would refuse, ``plgpu.CompilerParams``."""

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

RACE = False


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
