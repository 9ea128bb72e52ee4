"""Per-row indexed gather: out[r, k] = x[r, idx[r, k]] for x (R, C) and int32 idx (R, K)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x, idx):
    return jnp.take_along_axis(x, idx, axis=1)


def make_inputs(case, key):
    kx, ki = jax.random.split(key)
    r, c, k = case.dims["R"], case.dims["C"], case.dims["K"]
    x = jax.random.normal(kx, (r, c), jnp.float32).astype(case.dtype)
    if case.profile == "edge_ids":
        # Only the first and the last column: the edges of the column tiling.
        idx = jnp.where(jax.random.bernoulli(ki, 0.5, (r, k)), c - 1, 0).astype(jnp.int32)
    else:
        idx = jax.random.randint(ki, (r, k), 0, c, jnp.int32)
    return (x, idx)


SPEC = OpSpec(
    name="take_along_rows",
    category="gather",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 16, "C": 256, "K": 16})],
    extended=[
        Case("ragged", {"R": 20, "C": 300, "K": 24}),
        Case("bf16", {"R": 16, "C": 256, "K": 16}, dtype="bfloat16"),
        Case("edges", {"R": 16, "C": 256, "K": 16}, profile="edge_ids"),
    ],
    # A gather copies values: the result must be exact.
    tolerance={"float32": (0.0, 0.0), "bfloat16": (0.0, 0.0)},
    description="take_along_axis over the last axis, the columns tiled and selected by one-hot.",
)
