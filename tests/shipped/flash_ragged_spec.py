"""softmax(q k^T / sqrt(D)) v with more keys than queries and a query length no block size
divides: q (B, H, Q, D), k and v (B, H, K, D) (JAX's ops/tpu/flash_attention.py)."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf, precision=jax.lax.Precision.HIGHEST)
    p = jax.nn.softmax(s / math.sqrt(q.shape[-1]), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, vf, precision=jax.lax.Precision.HIGHEST).astype(q.dtype)


def make_inputs(case, key):
    kq, kk, kv = jax.random.split(key, 3)
    b, h, d = case.dims["B"], case.dims["H"], case.dims["D"]
    q = jax.random.normal(kq, (b, h, case.dims["Q"], d), jnp.float32)
    k = jax.random.normal(kk, (b, h, case.dims["K"], d), jnp.float32)
    v = jax.random.normal(kv, (b, h, case.dims["K"], d), jnp.float32)
    return tuple(x.astype(case.dtype) for x in (q, k, v))


SPEC = OpSpec(
    name="wild_ragged_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("ragged", {"B": 1, "H": 2, "Q": 200, "K": 256, "D": 128})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="JAX's shipped ops/tpu/flash_attention.py, a ragged query length",
)
