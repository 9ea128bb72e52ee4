"""GELU with the tanh approximation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "large":
        x = x * 20.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="gelu_tanh",
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
    description="Elementwise tanh-approximation GELU, computed in float32.",
)
