"""Softplus log(1 + exp(x)), computed stably as max(x, 0) + log1p(exp(-|x|))."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.nn.softplus(x.astype(jnp.float32)).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "large":
        x = x * 100.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="softplus",
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
    description="Numerically stable elementwise softplus.",
)
