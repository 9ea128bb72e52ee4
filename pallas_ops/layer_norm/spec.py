"""Layer normalisation over the last axis with a learned scale (gamma) and shift (beta)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-5


def reference(x, gamma, beta):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + EPS)
    y = y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(case, key):
    kx, kg, kb = jax.random.split(key, 3)
    rows, cols = case.dims["R"], case.dims["C"]
    x = jax.random.normal(kx, (rows, cols), jnp.float32)
    if case.profile == "offset":
        # A large common offset: a one-pass E[x^2] - E[x]^2 variance cancels catastrophically.
        x = x + 100.0
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (cols,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (cols,), jnp.float32)
    return (x.astype(case.dtype), gamma.astype(case.dtype), beta.astype(case.dtype))


SPEC = OpSpec(
    name="layer_norm",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 200}),
        Case("bf16", {"R": 64, "C": 256}, dtype="bfloat16"),
        Case("offset", {"R": 32, "C": 256}, profile="offset"),
    ],
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 1e-2)},
    description="Layer norm over the last axis: (x - mean) / sqrt(var + eps) * gamma + beta.",
)
