import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x, y):
    return jnp.dot(
        x, y, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    ).astype(x.dtype)


def make_inputs(case, key):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (case.dims["M"], case.dims["K"]), jnp.float32)
    y = jax.random.normal(ky, (case.dims["K"], case.dims["N"]), jnp.float32)
    return (x.astype(case.dtype), y.astype(case.dtype))


SPEC = OpSpec(
    name="wild_tpu_matmul",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 256, "K": 256, "N": 256})],
    tolerance={"float32": (1e-3, 1e-3)},
    description="JAX's shipped ops/tpu/matmul.py",
)
