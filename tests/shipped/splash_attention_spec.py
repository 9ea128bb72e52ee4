"""Causal softmax(q k^T) v per head (no logit scaling, as splash attention), q/k/v (H, S, D)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("hqd,hkd->hqk", qf, kf, precision=jax.lax.Precision.HIGHEST)
    n = q.shape[1]
    causal = jnp.arange(n)[:, None] >= jnp.arange(n)[None, :]
    s = jnp.where(causal, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("hqk,hkd->hqd", p, vf, precision=jax.lax.Precision.HIGHEST).astype(q.dtype)


def make_inputs(case, key):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (case.dims["H"], case.dims["S"], case.dims["D"])
    q = jax.random.normal(kq, shape, jnp.float32) * 0.125
    k = jax.random.normal(kk, shape, jnp.float32)
    v = jax.random.normal(kv, shape, jnp.float32)
    return tuple(x.astype(case.dtype) for x in (q, k, v))


SPEC = OpSpec(
    name="wild_splash_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"H": 2, "S": 256, "D": 128})],
    tolerance={"float32": (1e-4, 1e-4)},
    description="JAX's shipped splash attention, causal mask",
)
