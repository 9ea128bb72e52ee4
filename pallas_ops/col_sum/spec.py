"""Column sums of an (R, C) array: out[c] = sum_r x[r, c] (reduction over axis 0)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.sum(x.astype(jnp.float32), axis=0).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="col_sum",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 128, "C": 256})],
    extended=[
        Case("ragged", {"R": 100, "C": 300}),
        Case("tall", {"R": 512, "C": 128}),
    ],
    # Sums of a few hundred N(0, 1) values: float32 reordering error stays far below 1e-4.
    tolerance={"float32": (1e-4, 1e-5)},
    description="Sum over axis 0, accumulated across row blocks of a (column, row) grid.",
)
