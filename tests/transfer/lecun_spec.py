"""LeCun's scaled tanh, 1.7159 * tanh(2x / 3), elementwise over (R, C)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return (1.7159 * jnp.tanh(x.astype(jnp.float32) * 2.0 / 3.0)).astype(x.dtype)


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32) * 2.0,)


SPEC = OpSpec(
    name="lecun_tanh",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[Case("tall", {"R": 128, "C": 128})],
    tolerance={"float32": (1e-5, 1e-5)},
    description="LeCun's scaled tanh activation",
)
