"""SwiGLU gate: silu(a) * b = a * sigmoid(a) * b, elementwise over two (R, C) inputs."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b):
    out = jax.nn.silu(a.astype(jnp.float32)) * b.astype(jnp.float32)
    return out.astype(a.dtype)


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    shape = (case.dims["R"], case.dims["C"])
    a = jax.random.normal(ka, shape, jnp.float32)
    b = jax.random.normal(kb, shape, jnp.float32)
    if case.profile == "large":
        a = a * 50.0
    return (a.astype(case.dtype), b.astype(case.dtype))


SPEC = OpSpec(
    name="silu_mul",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 300}),
        Case("bf16", {"R": 64, "C": 512}, dtype="bfloat16"),
        Case("large", {"R": 64, "C": 256}, profile="large"),
    ],
    tolerance={"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)},
    description="SwiGLU gate silu(a) * b, computed in float32 and cast back to the input dtype.",
)
