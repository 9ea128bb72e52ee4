"""RMS normalisation over the last axis with a learned per-column weight."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-6


def reference(x, weight):
    xf = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
    y = xf * jax.lax.rsqrt(ms + EPS) * weight.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(case, key):
    kx, kw = jax.random.split(key)
    rows, cols = case.dims["R"], case.dims["C"]
    x = jax.random.normal(kx, (rows, cols), jnp.float32)
    if case.profile == "zero_rows":
        # Every fourth row is all zeros (padding tokens): eps is what keeps the result finite.
        x = jnp.where((jnp.arange(rows) % 4 == 0)[:, None], 0.0, x)
    weight = 1.0 + 0.1 * jax.random.normal(kw, (cols,), jnp.float32)
    return (x.astype(case.dtype), weight.astype(case.dtype))


SPEC = OpSpec(
    name="rms_norm",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 320}),
        Case("bf16", {"R": 64, "C": 256}, dtype="bfloat16"),
        Case("zero_rows", {"R": 32, "C": 256}, profile="zero_rows"),
    ],
    tolerance={"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)},
    description="RMS norm over the last axis: x / sqrt(mean(x^2) + eps) * weight.",
)
