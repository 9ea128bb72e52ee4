"""Row-wise log-sum-exp over the last axis: out[r] = log(sum_c exp(x[r, c]))."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.nn.logsumexp(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "large":
        x = x * 100.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="logsumexp_rows",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 320}),
        Case("large", {"R": 64, "C": 256}, profile="large"),
    ],
    tolerance={"float32": (1e-5, 1e-5)},
    description="Numerically stable log-sum-exp of each row, one value per row.",
)
