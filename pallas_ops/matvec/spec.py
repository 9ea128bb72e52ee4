"""Matrix-vector product with float32 results: y = A @ x, A (M, K), x (K,)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, x):
    return jnp.dot(a, x, preferred_element_type=jnp.float32)


def make_inputs(case, key):
    ka, kx = jax.random.split(key)
    m, k = case.dims["M"], case.dims["K"]
    a = jax.random.normal(ka, (m, k), jnp.float32)
    x = jax.random.normal(kx, (k,), jnp.float32)
    return (a.astype(case.dtype), x.astype(case.dtype))


SPEC = OpSpec(
    name="matvec",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 128, "K": 512})],
    extended=[
        Case("ragged", {"M": 200, "K": 300}),
        Case("bf16", {"M": 128, "K": 1024}, dtype="bfloat16"),
    ],
    # Products of bfloat16 inputs are exact in float32, so float32 accumulation stays tight.
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-4, 1e-4)},
    description="Tiled matrix-vector product accumulating in float32 across the K grid axis.",
)
