"""Column sums of (R, C), one listed case: R=64, two blocks of the kernel's 32 rows.

One case cannot tell an accumulator initialised on the first row block from one initialised
on every block but the second: both are right with exactly two blocks. The spec says which
sizes it allows (``domains``), and the engine's hidden cases draw from them.
"""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, Dim, OpSpec


def reference(x):
    return jnp.sum(x, axis=0, keepdims=True)


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32),)


SPEC = OpSpec(
    name="col_sum_one_case",
    category="reduction",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 128})],
    domains={"R": Dim(min=32, max=256, multiple_of=32)},
    tolerance={"float32": (1e-4, 1e-4)},
    description="Column sums, accumulated over row blocks in the output block.",
)
