"""Causal attention: grid (H, S/BQ); each step masks its BQ query rows against the full K and V."""

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BQ = 32


def _causal_attention_body(q_ref, k_ref, v_ref, o_ref):
    q = q_ref[...].astype(jnp.float32)
    k = k_ref[...].astype(jnp.float32)
    v = v_ref[...].astype(jnp.float32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = jax.lax.dot_general(
        q,
        k,
        (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=jax.lax.Precision.HIGHEST,
    )
    s = s * scale
    # Global positions: this block's query rows start at program_id(1) * BQ.
    row = pl.program_id(1) * BQ + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    col = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(col <= row, s, -jnp.inf)
    s = s - jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s)
    p = p / jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.dot(p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    o_ref[...] = out.astype(o_ref.dtype)


def kernel(q, k, v):
    heads, seq, dim = q.shape
    return pl.pallas_call(
        _causal_attention_body,
        grid=(heads, pl.cdiv(seq, BQ)),
        in_specs=[
            pl.BlockSpec((None, BQ, dim), lambda h, i: (h, i, 0)),
            pl.BlockSpec((None, seq, dim), lambda h, i: (h, 0, 0)),
            pl.BlockSpec((None, seq, dim), lambda h, i: (h, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, BQ, dim), lambda h, i: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, k, v)
