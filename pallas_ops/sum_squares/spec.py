"""Global sum of squares of an (R, C) array, returned as a (1, 1) float32 array."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.sum(jnp.square(x.astype(jnp.float32))).reshape(1, 1)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="sum_squares",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 128, "C": 256})],
    extended=[
        Case("ragged", {"R": 100, "C": 300}),
        Case("bf16", {"R": 128, "C": 512}, dtype="bfloat16"),
    ],
    # A float32 sum of ~65k positive terms in another order differs by ~1e-6 relative.
    tolerance={"float32": (1e-4, 2e-5), "bfloat16": (1e-4, 2e-5)},
    description="Sum of squares of all elements, accumulated into one float32 scalar.",
)
