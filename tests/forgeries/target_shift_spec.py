"""Spec for ``target_alias_neighbour.py``: each 8-row block plus the next one (the last block
plus itself). out[r] = x[r] + x[r + 8] for the first R - 8 rows, 2 * x[r] for the last 8."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return x + jnp.concatenate([x[8:], x[-8:]], axis=0)


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32),)


SPEC = OpSpec(
    name="shift_add_rows",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    description="Adds to each 8-row block the next one.",
)
