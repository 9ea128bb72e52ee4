"""Matrix multiply with float32 results, every dim a multiple of 128: C = A @ B."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, Dim, OpSpec


def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    m, k, n = case.dims["M"], case.dims["K"], case.dims["N"]
    a = jax.random.normal(ka, (m, k), jnp.float32)
    b = jax.random.normal(kb, (k, n), jnp.float32)
    return (a.astype(case.dtype), b.astype(case.dtype))


TILE = Dim(min=128, max=512, multiple_of=128)

SPEC = OpSpec(
    name="matmul_k_loop",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 128, "K": 256, "N": 128})],
    extended=[
        Case("bf16", {"M": 128, "K": 512, "N": 256}, dtype="bfloat16"),
        Case("odd_k", {"M": 256, "K": 384, "N": 128}),
    ],
    # Products of bfloat16 inputs are exact in float32, so float32 accumulation stays tight.
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-4, 1e-4)},
    description="Tiled matrix multiply contracting K inside each program: right on TPU and GPU.",
    domains={"M": TILE, "K": TILE, "N": TILE},
)
