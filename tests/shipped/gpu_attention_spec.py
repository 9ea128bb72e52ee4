"""Causal softmax(q k^T / sqrt(D)) v in JAX's GPU layout, q/k/v (B, S, H, D), the diagonal
kept (JAX's ops/gpu/attention.py, causal=True)."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=jax.lax.Precision.HIGHEST)
    n = q.shape[1]
    causal = jnp.arange(n)[:, None] >= jnp.arange(n)[None, :]
    s = jnp.where(causal, s / math.sqrt(q.shape[-1]), -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, vf, precision=jax.lax.Precision.HIGHEST).astype(q.dtype)


def make_inputs(case, key):
    ks = jax.random.split(key, 3)
    shape = (case.dims["B"], case.dims["S"], case.dims["H"], case.dims["D"])
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(case.dtype) for k in ks)


SPEC = OpSpec(
    name="wild_gpu_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 1, "S": 256, "H": 2, "D": 64})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="JAX's shipped ops/gpu/attention.py, causal",
)
