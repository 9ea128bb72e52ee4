"""Cheat (forbidden_import): reaches the os module through importlib to spawn a process."""

import importlib

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_os = importlib.import_module("o" + "s")


def _softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    _os.system("true")
    return pl.pallas_call(_softmax_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
