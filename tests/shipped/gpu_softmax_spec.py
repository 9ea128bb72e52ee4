"""Softmax over the last axis of (R, C), a width no power of two (JAX's gpu/softmax.py pads the
row to the next power of two); one case of ordinary logits, one of large ones (|x| in the
hundreds, where exp overflows float32 unless the row max is subtracted first)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(case, key):
    x = jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32)
    if case.profile == "large_logits":
        x = 60.0 * x
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="wild_gpu_softmax",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[
        Case("ragged", {"R": 8, "C": 200}),
        Case("large", {"R": 8, "C": 200}, profile="large_logits"),
    ],
    tolerance={"float32": (1e-5, 1e-5)},
    description="JAX's shipped ops/gpu/softmax.py on a ragged width and large logits",
)
