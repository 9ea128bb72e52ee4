"""A matmul with LeCun's scaled tanh as its epilogue: 1.7159 * tanh(2 (a @ b) / 3)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b):
    x = jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
    return (1.7159 * jnp.tanh(x * 2.0 / 3.0)).astype(a.dtype)


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (case.dims["M"], case.dims["K"]), jnp.float32) / 8.0
    b = jax.random.normal(kb, (case.dims["K"], case.dims["N"]), jnp.float32)
    return a, b


SPEC = OpSpec(
    name="matmul_lecun",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 128, "K": 256, "N": 128})],
    extended=[Case("wide", {"M": 64, "K": 128, "N": 256})],
    tolerance={"float32": (1e-4, 1e-4)},
    description="matmul with a scaled-tanh epilogue",
)
