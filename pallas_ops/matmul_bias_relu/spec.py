"""Fused linear layer with float32 results: relu(A @ B + bias), A (M, K), B (K, N), bias (N,)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b, bias):
    acc = jnp.dot(a, b, preferred_element_type=jnp.float32)
    return jnp.maximum(acc + bias.astype(jnp.float32), 0.0)


def make_inputs(case, key):
    ka, kb, kc = jax.random.split(key, 3)
    m, k, n = case.dims["M"], case.dims["K"], case.dims["N"]
    a = jax.random.normal(ka, (m, k), jnp.float32)
    b = jax.random.normal(kb, (k, n), jnp.float32)
    # A bias comparable to the product's spread, so a misplaced bias changes many outputs.
    bias = 8.0 * jax.random.normal(kc, (n,), jnp.float32)
    return (a.astype(case.dtype), b.astype(case.dtype), bias.astype(case.dtype))


SPEC = OpSpec(
    name="matmul_bias_relu",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 64, "K": 256, "N": 64})],
    extended=[
        Case("wide", {"M": 128, "K": 256, "N": 256}),
        Case("ragged", {"M": 100, "K": 200, "N": 130}),
        Case("bf16", {"M": 64, "K": 512, "N": 128}, dtype="bfloat16"),
    ],
    # Products of bfloat16 inputs are exact in float32, so float32 accumulation stays tight.
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-4, 1e-4)},
    description="Tiled matmul with a fused bias + ReLU epilogue on the last K step.",
)
