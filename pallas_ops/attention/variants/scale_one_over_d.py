"""Bug: the logits are scaled by 1/D instead of 1/sqrt(D), so the softmax is far too flat."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BQ = 32


def _attention_body(q_ref, k_ref, v_ref, o_ref):
    q = q_ref[...].astype(jnp.float32)
    k = k_ref[...].astype(jnp.float32)
    v = v_ref[...].astype(jnp.float32)
    scale = 1.0 / q.shape[-1]
    s = jax.lax.dot_general(
        q,
        k,
        (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=jax.lax.Precision.HIGHEST,
    )
    s = s * scale
    s = s - jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s)
    p = p / jnp.sum(p, axis=-1, keepdims=True)
    o_ref[...] = jnp.dot(
        p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST
    ).astype(o_ref.dtype)


def kernel(q, k, v):
    heads, seq, dim = q.shape
    return pl.pallas_call(
        _attention_body,
        grid=(heads, pl.cdiv(seq, BQ)),
        in_specs=[
            pl.BlockSpec((None, BQ, dim), lambda h, i: (h, i, 0)),
            pl.BlockSpec((None, seq, dim), lambda h, i: (h, 0, 0)),
            pl.BlockSpec((None, seq, dim), lambda h, i: (h, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, BQ, dim), lambda h, i: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, k, v)
