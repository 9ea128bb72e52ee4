"""Inclusive prefix sum along the last axis of a (R, C) array: out[r, c] = sum(x[r, :c + 1])."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.cumsum(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "positive_drift":
        # Long runs of same-signed values: the prefix grows to hundreds, so any lost carry or
        # rounding of the running sum shows.
        x = jnp.abs(x) + 1.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="cumsum_rows",
    category="scan",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 8, "C": 512})],
    extended=[
        Case("ragged", {"R": 20, "C": 300}),
        Case("bf16", {"R": 16, "C": 256}, dtype="bfloat16"),
        Case("drift", {"R": 8, "C": 512}, profile="positive_drift"),
    ],
    tolerance={"float32": (2e-4, 2e-5), "bfloat16": (1e-2, 1e-2)},
    description="Inclusive cumulative sum along the last axis, tiled with a carry across blocks.",
)
