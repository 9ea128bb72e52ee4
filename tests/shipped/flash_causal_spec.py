"""Causal softmax(q k^T / sqrt(D)) v over (B, H, S, D), the diagonal kept (JAX's
ops/tpu/flash_attention.py with causal=True)."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf, precision=jax.lax.Precision.HIGHEST)
    n = q.shape[2]
    causal = jnp.arange(n)[:, None] >= jnp.arange(n)[None, :]
    s = jnp.where(causal, s / math.sqrt(q.shape[-1]), -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, vf, precision=jax.lax.Precision.HIGHEST).astype(q.dtype)


def make_inputs(case, key):
    ks = jax.random.split(key, 3)
    shape = (case.dims["B"], case.dims["H"], case.dims["S"], case.dims["D"])
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(case.dtype) for k in ks)


SPEC = OpSpec(
    name="wild_causal_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 1, "H": 2, "S": 256, "D": 128})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="JAX's shipped ops/tpu/flash_attention.py, causal, 128-wide blocks",
)
