"""Row sums, with a bfloat16 case at dims of its own: the control tests' spec for a dtype trigger
(float32 at those dims is no suite case, so a control runs it)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.sum(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    return (
        jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32).astype(case.dtype),
    )


SPEC = OpSpec(
    name="row_sum",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 16, "C": 256})],
    extended=[Case("bf16", {"R": 8, "C": 512}, dtype="bfloat16")],
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 1e-2)},
    description="Sum over the last axis, accumulated in float32.",
)
