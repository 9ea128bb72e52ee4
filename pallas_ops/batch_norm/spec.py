"""Batch norm (training statistics): each column normalised by its mean and variance over rows."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-5


def reference(x, gamma, beta):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=0, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=0, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + EPS)
    y = y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(case, key):
    kx, kg, kb, km = jax.random.split(key, 4)
    rows, cols = case.dims["N"], case.dims["C"]
    x = jax.random.normal(kx, (rows, cols), jnp.float32)
    if case.profile == "offset":
        # Columns with large, different means: one-pass E[x^2] - E[x]^2 variance cancels.
        x = 3.0 * x + 50.0 + 10.0 * jax.random.normal(km, (1, cols), jnp.float32)
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (cols,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (cols,), jnp.float32)
    return (x.astype(case.dtype), gamma.astype(case.dtype), beta.astype(case.dtype))


SPEC = OpSpec(
    name="batch_norm",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"N": 64, "C": 128})],
    extended=[
        Case("ragged", {"N": 100, "C": 256}),
        Case("bf16", {"N": 64, "C": 128}, dtype="bfloat16"),
        Case("offset", {"N": 64, "C": 128}, profile="offset"),
    ],
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 1e-2)},
    description="Batch norm over rows: per-column (x - mean) / sqrt(var + eps) * gamma + beta.",
)
