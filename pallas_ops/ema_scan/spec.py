"""Exponential moving average along time: h_t = a * h_{t-1} + (1 - a) * x_t, h_{-1} = 0."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x, a):
    """x (T, D) in time-major layout, a (D,) float32 per-channel decay; returns h (T, D)."""
    a32 = a.astype(jnp.float32)

    def step(h, xt):
        h = a32 * h + (1.0 - a32) * xt.astype(jnp.float32)
        return h, h

    _, hs = jax.lax.scan(step, jnp.zeros(x.shape[1], jnp.float32), x)
    return hs.astype(x.dtype)


def make_inputs(case, key):
    kx, ka = jax.random.split(key)
    t, d = case.dims["T"], case.dims["D"]
    x = jax.random.normal(kx, (t, d), jnp.float32)
    low, high = (0.99, 0.999) if case.profile == "slow_decay" else (0.8, 0.99)
    a = jax.random.uniform(ka, (d,), jnp.float32, low, high)
    if case.profile == "slow_decay":
        # A slow average of a signal with an offset: h creeps towards 3 over hundreds of steps.
        x = x + 3.0
    return (x.astype(case.dtype), a)


SPEC = OpSpec(
    name="ema_scan",
    category="scan",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"T": 128, "D": 128})],
    extended=[
        Case("ragged", {"T": 100, "D": 160}),
        Case("bf16", {"T": 128, "D": 128}, dtype="bfloat16"),
        Case("slow", {"T": 128, "D": 128}, profile="slow_decay"),
    ],
    tolerance={"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)},
    description="Per-channel exponential moving average along time, carried across time blocks.",
)
