"""Causal attention per head (query i sees keys j <= i): softmax(q k^T / sqrt(D)) v."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    seq = q.shape[1]
    s = jnp.einsum("hqd,hkd->hqk", qf, kf) / math.sqrt(q.shape[-1])
    causal = jnp.arange(seq)[None, :] <= jnp.arange(seq)[:, None]
    s = jnp.where(causal[None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("hqk,hkd->hqd", p, vf).astype(q.dtype)


def make_inputs(case, key):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (case.dims["H"], case.dims["S"], case.dims["D"])
    q = jax.random.normal(kq, shape, jnp.float32)
    k = jax.random.normal(kk, shape, jnp.float32)
    v = jax.random.normal(kv, shape, jnp.float32)
    if case.profile == "large":
        # Logits with a spread of ~36: exp() of the raw scores overflows float32.
        q, k = q * 6.0, k * 6.0
    return tuple(x.astype(case.dtype) for x in (q, k, v))


SPEC = OpSpec(
    name="causal_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"H": 2, "S": 128, "D": 64})],
    extended=[
        Case("ragged", {"H": 2, "S": 100, "D": 64}),
        Case("bf16", {"H": 2, "S": 128, "D": 64}, dtype="bfloat16"),
        Case("large", {"H": 2, "S": 128, "D": 64}, profile="large"),
    ],
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 1e-2)},
    description="Causal softmax attention per head (key j visible to query i iff j <= i).",
)
