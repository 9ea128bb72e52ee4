"""Target attack (tpu-v5p and gpu, integrity enforce): an output revisit hidden behind a
scalar-prefetch table.

Doubles its input over a grid of 2 x R/8 points: grid point i works on row block ``table[i]``
with ``table = arange(2 * R/8) // 2``, read from scalar-prefetch memory, so two consecutive grid
points write one output block (the first stores x, the second adds x again). Right in program
order; the axis is declared ``parallel``, so the pair races on a megacore TPU or a GPU. The
output's index map reads the table: ``integrity.grid`` cannot evaluate it and must answer
"undetermined", never "each block written once".
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR = 8


def _body(table_ref, x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i % 2 == 0)
    def _first():
        o_ref[...] = x_ref[...]

    @pl.when(i % 2 == 1)
    def _second():
        o_ref[...] = o_ref[...] + x_ref[...]


def kernel(x):
    r, c = x.shape
    steps = 2 * (r // BR)
    table = jnp.arange(steps, dtype=jnp.int32) // 2
    return pl.pallas_call(
        _body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(steps,),
            in_specs=[pl.BlockSpec((BR, c), lambda i, t: (t[i], 0))],
            out_specs=pl.BlockSpec((BR, c), lambda i, t: (t[i], 0)),
        ),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(table, x)
