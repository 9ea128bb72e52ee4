"""Doubles its input over a grid whose size is a traced value (as megablox gmm's tile count,
computed from its group sizes): the grid is only known at run time."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _body(tiles_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def kernel(x):
    rows, cols = x.shape
    tiles = jnp.full((1,), rows // 8, jnp.int32)
    active = jnp.sum(tiles)  # a traced grid bound
    return pl.pallas_call(
        _body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(active,),
            in_specs=[pl.BlockSpec((8, cols), lambda i, t: (i, 0))],
            out_specs=pl.BlockSpec((8, cols), lambda i, t: (i, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(tiles, x)
