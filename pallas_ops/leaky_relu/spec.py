"""Leaky ReLU: x where x >= 0, else NEGATIVE_SLOPE * x (slope 0.01)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

NEGATIVE_SLOPE = 0.01


def reference(x):
    y = jax.nn.leaky_relu(x.astype(jnp.float32), negative_slope=NEGATIVE_SLOPE)
    return y.astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "all_negative":
        x = -jnp.abs(x) * 10.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="leaky_relu",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 300}),
        Case("bf16", {"R": 64, "C": 512}, dtype="bfloat16"),
        Case("all_negative", {"R": 64, "C": 256}, profile="all_negative"),
    ],
    tolerance={"float32": (1e-6, 1e-6), "bfloat16": (1e-2, 1e-2)},
    description="Elementwise leaky ReLU with negative slope 0.01.",
)
