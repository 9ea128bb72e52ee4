"""Running maximum along the last axis of a (R, C) array: out[r, c] = max(x[r, :c + 1])."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.lax.cummax(x.astype(jnp.float32), axis=x.ndim - 1).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "all_negative":
        # Every value below zero: a running max that starts from 0 instead of -inf shows.
        x = -jnp.abs(x) - 1.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="cummax_rows",
    category="scan",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 16, "C": 512})],
    extended=[
        Case("ragged", {"R": 20, "C": 300}),
        Case("bf16", {"R": 16, "C": 256}, dtype="bfloat16"),
        Case("negative", {"R": 16, "C": 512}, profile="all_negative"),
    ],
    # A running max selects input values: the result is exact in any dtype.
    tolerance={"float32": (0.0, 0.0), "bfloat16": (0.0, 0.0)},
    description="Cumulative maximum along the last axis, tiled with a running-max carry.",
)
