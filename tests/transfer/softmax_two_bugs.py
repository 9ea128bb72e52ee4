"""Softmax over rows with two bugs the playbook repairs (no max subtraction; a floor-divided
grid), and pallas imported under its own name: a patch learned on a kernel that calls it ``pl``
(``pl.cdiv``) breaks this one's build. For the fleet-order test (tests/test_fleet.py)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas

BLOCK_R = 8


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x)
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    rows, cols = x.shape
    return pallas.pallas_call(
        _softmax_body,
        grid=(rows // BLOCK_R,),
        in_specs=[pallas.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pallas.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
