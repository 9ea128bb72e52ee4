"""A tiny operator for the end-to-end tests: every element doubled.

Those tests are about the workflow around checks (tools, replays, fleets, restarts), not about
the kernel: an elementwise kernel on small arrays keeps each check near its fixed cost, and the
compact suite holds the ragged case, so a floor-divided grid (``variants/floor_grid.py``) fails
a session's first check and the session goes straight to its first fix. Laid out as a corpus
operator is (``pallas_ops/<op>/``), so a fleet names its members ``double_rows/<variant>``.
"""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return (x.astype(jnp.float32) * 2.0).astype(x.dtype)


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32),)


SPEC = OpSpec(
    name="double_rows",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("ragged", {"R": 12, "C": 128})],
    extended=[Case("tall", {"R": 24, "C": 128})],
    tolerance={"float32": (1e-6, 1e-6)},
    description="Every element doubled.",
)
