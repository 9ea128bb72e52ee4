"""Target attack (tpu-v5p and gpu, integrity enforce): the output block revisits hidden from the
grid check by leaving the output in ``pl.ANY`` (HBM) and writing it by DMA.

Doubles its input (``tests/planted/tpu_spec``) over a grid (R/8, 2): at j = 0 a program copies
its 8 rows of x to the output, at j = 1 it reads them back and adds x again. Right in program
order; both axes are declared ``parallel``, so on a megacore TPU or a GPU the two halves of one
row block race on the output. With the output in ``pl.ANY`` there is no output window, no index
map: ``integrity.grid`` must answer "undetermined", never "no revisit".
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR = 8


def _body(x_ref, o_hbm, acc_ref):
    i, j = pl.program_id(0), pl.program_id(1)
    rows = o_hbm.at[pl.ds(i * BR, BR)]

    @pl.when(j == 0)
    def _first():
        acc_ref[...] = x_ref[...]

    @pl.when(j == 1)
    def _second():
        pltpu.sync_copy(rows, acc_ref)
        acc_ref[...] = acc_ref[...] + x_ref[...]

    pltpu.sync_copy(acc_ref, rows)


def kernel(x):
    r, c = x.shape
    return pl.pallas_call(
        _body,
        grid=(r // BR, 2),
        in_specs=[pl.BlockSpec((BR, c), lambda i, j: (i, 0))],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BR, c), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x)
