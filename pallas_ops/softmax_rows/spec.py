"""Row-wise softmax over the last axis (numerically stable)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "large":
        x = x * 30.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="softmax_rows",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 320}),
        Case("large", {"R": 64, "C": 256}, profile="large"),
    ],
    tolerance={"float32": (1e-5, 1e-5)},
    description="Numerically stable softmax over the last axis.",
)
