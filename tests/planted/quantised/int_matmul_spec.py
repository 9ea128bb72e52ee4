"""An int8 x int8 -> int32 matmul: integer outputs, which a correct kernel matches exactly."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.int32)


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    m, n, k = case.dims["M"], case.dims["N"], case.dims["K"]
    a = jax.random.randint(ka, (m, k), -128, 128, jnp.int32).astype(jnp.int8)
    b = jax.random.randint(kb, (k, n), -128, 128, jnp.int32).astype(jnp.int8)
    return a, b


SPEC = OpSpec(
    name="int8_matmul",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 32, "N": 128, "K": 512})],
    extended=[Case("small", {"M": 8, "N": 128, "K": 256})],
)
