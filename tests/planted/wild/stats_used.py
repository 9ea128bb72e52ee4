"""stats_discarded.py with the statistics used: their block, revisited along an axis declared
parallel, reaches the result (times zero, so the numbers stay right in program order). A race."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

USE_STATS = True


def _body(x_ref, stats_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _init():
        stats_ref[...] = jnp.zeros_like(stats_ref)

    stats_ref[...] = jnp.maximum(stats_ref[...], jnp.max(jnp.abs(x_ref[...])))
    o_ref[...] = x_ref[...] * 2.0


def _call(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // 8,),
        in_specs=[pl.BlockSpec((8, cols), lambda i: (i, 0))],
        out_specs=[
            pl.BlockSpec((8, 128), lambda i: (0, 0)),  # statistics: one block for every point
            pl.BlockSpec((8, cols), lambda i: (i, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((8, 128), jnp.float32),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
        ],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x)


def kernel(x):
    stats, out = _call(x)
    if USE_STATS:
        return out.at[0, 0].add(0.0 * stats[0, 0])
    return out
