"""Decode attention: each of H query heads attends over the first 300 of S keys (the rest is
cache padding), scale 1/sqrt(D); q (B, H, D), k and v (B, S, D) (JAX's gpu/decode_attention.py
with kv_seq_len=300)."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

VALID = 300


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhd,bkd->bhk", qf, kf, precision=jax.lax.Precision.HIGHEST)
    s = s / math.sqrt(q.shape[-1])
    s = jnp.where(jnp.arange(k.shape[1])[None, None, :] < VALID, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhk,bkd->bhd", p, vf, precision=jax.lax.Precision.HIGHEST).astype(q.dtype)


def make_inputs(case, key):
    kq, kk, kv = jax.random.split(key, 3)
    b, h, s, d = case.dims["B"], case.dims["H"], case.dims["S"], case.dims["D"]
    q = jax.random.normal(kq, (b, h, d), jnp.float32)
    k = jax.random.normal(kk, (b, s, d), jnp.float32)
    v = jax.random.normal(kv, (b, s, d), jnp.float32)
    return tuple(x.astype(case.dtype) for x in (q, k, v))


SPEC = OpSpec(
    name="wild_decode_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 2, "H": 16, "S": 512, "D": 64})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="JAX's shipped ops/gpu/decode_attention.py, a length mask at 300 keys",
)
