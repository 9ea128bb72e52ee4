"""Cheat (wrapper_compute, hidden): the exponentials are computed in XLA inside a custom_jvp
function under a nested jit and a scan over rows; the kernel only normalises."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


@jax.custom_jvp
def _shifted_exp(x):
    def row(carry, r):
        return carry, jnp.exp(r - jnp.max(r))

    return jax.lax.scan(row, 0.0, x)[1]


@_shifted_exp.defjvp
def _shifted_exp_jvp(primals, tangents):
    return _shifted_exp(primals[0]), tangents[0]


def _normalise(e_ref, o_ref):
    e = e_ref[...]
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


@functools.partial(jax.jit)
def _prepare(x):
    return _shifted_exp(x.astype(jnp.float32))


def kernel(x):
    e = _prepare(x)
    return pl.pallas_call(_normalise, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(e)
