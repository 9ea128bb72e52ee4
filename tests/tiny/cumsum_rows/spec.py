"""The shipped ``cumsum_rows`` spec (``pallas_ops/cumsum_rows/spec.py``) cut to the two cases an
experiment on a lost carry needs, the ragged one first: there the compact suite holds the case
whose row blocks a carry crosses, so a carry reset on the wrong axis fails the session's first
check (the shipped compact case is one row block, which such a kernel passes)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.cumsum(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32),)


SPEC = OpSpec(
    name="cumsum_rows",
    category="scan",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("ragged", {"R": 20, "C": 300})],
    extended=[Case("base", {"R": 8, "C": 512})],
    tolerance={"float32": (2e-4, 2e-5)},
    description="Inclusive cumulative sum along the last axis, tiled with a carry across blocks.",
)
