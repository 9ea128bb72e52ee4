"""Row-wise population variance over the last axis: mean((x - mean(x))^2), divided by N."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.var(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "offset":
        x = x + 1000.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="row_variance",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 320}),
        Case("offset", {"R": 64, "C": 256}, profile="offset"),
    ],
    tolerance={"float32": (1e-5, 1e-5)},
    description="Population variance (divide by N) of each row, computed with a two-pass formula.",
)
