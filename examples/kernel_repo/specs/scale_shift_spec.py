"""What kernels/scale_shift.py must compute: x * scale + shift, scale and shift per column."""

import jax
import jax.numpy as jnp

from nearmiss import Case, OpSpec


def reference(x, scale, shift):
    y = x.astype(jnp.float32) * scale.astype(jnp.float32) + shift.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(case, key):
    kx, ks, kb = jax.random.split(key, 3)
    rows, cols = case.dims["R"], case.dims["C"]
    x = jax.random.normal(kx, (rows, cols), jnp.float32).astype(case.dtype)
    scale = jax.random.normal(ks, (cols,), jnp.float32).astype(case.dtype)
    shift = jax.random.normal(kb, (cols,), jnp.float32).astype(case.dtype)
    return x, scale, shift


SPEC = OpSpec(
    name="scale_shift",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 32, "C": 256})],
    extended=[Case("ragged", {"R": 40, "C": 300}), Case("bf16", {"R": 32, "C": 256}, "bfloat16")],
    tolerance={"float32": (1e-6, 1e-6), "bfloat16": (1e-2, 1e-2)},
    description="Per-column scale and shift of a 2-D array.",
)
