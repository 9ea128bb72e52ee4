"""x - 0.5 * y elementwise over (R, C): two inputs a kernel can take in the wrong order."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x, y):
    return x - 0.5 * y


def make_inputs(case, key):
    kx, ky = jax.random.split(key)
    shape = (case.dims["R"], case.dims["C"])
    return jax.random.normal(kx, shape, jnp.float32), jax.random.normal(ky, shape, jnp.float32)


SPEC = OpSpec(
    name="axpy",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[Case("tall", {"R": 128, "C": 128})],
    tolerance={"float32": (1e-5, 1e-5)},
    description="x minus half of y",
)
