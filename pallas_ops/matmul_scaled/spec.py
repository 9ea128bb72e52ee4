"""Scaled matrix multiply with float32 results: alpha * (A @ B), alpha a float32 input (1,)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b, scale):
    return scale[0] * jnp.dot(a, b, preferred_element_type=jnp.float32)


def make_inputs(case, key):
    ka, kb, ks = jax.random.split(key, 3)
    m, k, n = case.dims["M"], case.dims["K"], case.dims["N"]
    a = jax.random.normal(ka, (m, k), jnp.float32)
    b = jax.random.normal(kb, (k, n), jnp.float32)
    # The scale stays float32 (a dequantisation or 1/sqrt(d) factor), well away from 1.
    scale = jax.random.uniform(ks, (1,), jnp.float32, minval=0.1, maxval=0.5)
    return (a.astype(case.dtype), b.astype(case.dtype), scale)


SPEC = OpSpec(
    name="matmul_scaled",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 128, "K": 128, "N": 128})],
    extended=[
        Case("deep", {"M": 64, "K": 512, "N": 128}),
        Case("bf16", {"M": 128, "K": 384, "N": 64}, dtype="bfloat16"),
    ],
    # Products of bfloat16 inputs are exact in float32, so float32 accumulation stays tight.
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-4, 1e-4)},
    description="Tiled matmul; the last K step multiplies by an input scale (fused epilogue).",
)
