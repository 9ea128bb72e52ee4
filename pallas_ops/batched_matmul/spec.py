"""Batched matrix multiply with float32 results: C[b] = A[b] @ B[b], A (B, M, K), B (B, K, N)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b):
    return jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=jnp.float32)


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    bsz, m, k, n = case.dims["B"], case.dims["M"], case.dims["K"], case.dims["N"]
    a = jax.random.normal(ka, (bsz, m, k), jnp.float32)
    b = jax.random.normal(kb, (bsz, k, n), jnp.float32)
    return (a.astype(case.dtype), b.astype(case.dtype))


SPEC = OpSpec(
    name="batched_matmul",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 2, "M": 64, "K": 256, "N": 64})],
    extended=[
        Case("ragged", {"B": 3, "M": 100, "K": 200, "N": 96}),
        Case("bf16", {"B": 2, "M": 64, "K": 512, "N": 128}, dtype="bfloat16"),
    ],
    # Products of bfloat16 inputs are exact in float32, so float32 accumulation stays tight.
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-4, 1e-4)},
    description="Batched tiled matmul accumulating in float32 across the K grid axis.",
)
