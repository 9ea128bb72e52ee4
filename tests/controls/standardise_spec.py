"""Row standardisation, (x - mean) / sqrt(var + eps) over the last axis: the control tests'
spec with a ragged width only in its offset case (the layer-norm situation of issue 16)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-5


def reference(x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + EPS)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "offset":
        x = x + 100.0
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="row_standardise",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 16, "C": 256})],
    extended=[Case("offset", {"R": 16, "C": 200}, profile="offset")],
    tolerance={"float32": (1e-4, 1e-4)},
    description="Standardise each row: subtract its mean, divide by its standard deviation.",
)
