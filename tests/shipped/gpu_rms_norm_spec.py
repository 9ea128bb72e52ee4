"""RMS norm over the last axis of (B, S, C), weight and bias, eps 1e-5 (JAX's gpu/rms_norm.py)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-5


def reference(x, weight, bias):
    xf = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
    y = xf * jax.lax.rsqrt(ms + EPS) * weight.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(case, key):
    kx, kw, kb = jax.random.split(key, 3)
    b, s, c = case.dims["B"], case.dims["S"], case.dims["C"]
    x = jax.random.normal(kx, (b, s, c), jnp.float32)
    w = 1.0 + 0.1 * jax.random.normal(kw, (c,), jnp.float32)
    bias = 0.1 * jax.random.normal(kb, (c,), jnp.float32)
    return (x.astype(case.dtype), w.astype(case.dtype), bias.astype(case.dtype))


SPEC = OpSpec(
    name="wild_gpu_rms_norm",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 2, "S": 8, "C": 256})],
    tolerance={"float32": (1e-5, 1e-5)},
    description="JAX's shipped ops/gpu/rms_norm.py",
)
