"""Matrix multiply with float32 results: C = A @ B, A (M, K), B (K, N)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    m, k, n = case.dims["M"], case.dims["K"], case.dims["N"]
    a = jax.random.normal(ka, (m, k), jnp.float32)
    b = jax.random.normal(kb, (k, n), jnp.float32)
    return (a.astype(case.dtype), b.astype(case.dtype))


SPEC = OpSpec(
    name="matmul",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 128, "K": 256, "N": 128})],
    extended=[
        Case("bf16", {"M": 128, "K": 512, "N": 128}, dtype="bfloat16"),
        Case("tall", {"M": 256, "K": 128, "N": 64}),
    ],
    # Products of bfloat16 inputs are exact in float32, so float32 accumulation stays tight.
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-4, 1e-4)},
    description="Tiled matrix multiply accumulating in float32 across the K grid axis.",
)
