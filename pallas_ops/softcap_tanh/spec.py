"""Logit soft-capping: CAP * tanh(x / CAP) with CAP = 30 (Gemma-style final-logit capping)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

CAP = 30.0


def reference(x):
    return (CAP * jnp.tanh(x.astype(jnp.float32) / CAP)).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "large":
        x = x * 1000.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="softcap_tanh",
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
    description="Logit soft-capping cap * tanh(x / cap) with cap = 30.",
)
