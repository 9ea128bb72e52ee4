"""Target forgery (gpu): a kernel Triton refuses, whose process files another kernel's lowering.

Leaky ReLU in one block as large as the array: right in every interpret mode, but the spec's
row counts are not powers of two, and Pallas' Triton lowering refuses such a block. At import
the candidate swaps that lowering, in its own process, for one that lowers a decoy kernel with
(32, 128) tiles, which Triton takes: the modules filed for the executor to read are clean, and
are not this program's. The gate refuses the swap (a private JAX module imported); with the
gate only reporting, the executor still refuses to count modules that are not the artifact's
kernels.
"""

import jax
import jax.numpy as jnp
from jax._src.pallas.triton import lowering as _lowering
from jax.experimental import pallas as pl

NEGATIVE_SLOPE = 0.01


def _leaky_relu_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = jnp.where(x >= 0, x, NEGATIVE_SLOPE * x).astype(o_ref.dtype)


def kernel(x):
    return pl.pallas_call(_leaky_relu_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _decoy(x):
    spec = pl.BlockSpec((32, 128), lambda i, j: (i, j))
    return pl.pallas_call(
        _leaky_relu_body,
        grid=(2, 2),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        name="decoy",
    )(x)


_real_lowering = _lowering.lower_jaxpr_to_triton_module


def _decoy_lowering(jaxpr, grid_mapping, *args, **kwargs):
    decoy = jax.make_jaxpr(_decoy)(jnp.zeros((64, 256), jnp.float32))
    params = next(e.params for e in decoy.jaxpr.eqns if e.primitive.name == "pallas_call")
    return _real_lowering(params["jaxpr"], params["grid_mapping"], *args, **kwargs)


_lowering.lower_jaxpr_to_triton_module = _decoy_lowering
