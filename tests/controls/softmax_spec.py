"""Row softmax whose large-magnitude case has dims of its own: the control tests' spec for a
profile trigger (the normal profile at the same dims is no suite case, so a control runs it)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.nn.softmax(x, axis=-1)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    return ((x * 30.0 if case.profile == "large" else x).astype(case.dtype),)


SPEC = OpSpec(
    name="row_softmax",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 16, "C": 128})],
    extended=[Case("large", {"R": 8, "C": 256}, profile="large")],
    tolerance={"float32": (1e-5, 1e-5)},
    description="Softmax over the last axis.",
)
