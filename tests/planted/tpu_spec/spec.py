"""A spec that declares its kernels' target: checks go to TPU v5e unless --target says else."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return x * 2.0


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32),)


SPEC = OpSpec(
    name="double_tpu",
    category="elementwise",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    targets=("tpu-v5e",),
    description="Doubles its input; meant for TPU v5e.",
)
