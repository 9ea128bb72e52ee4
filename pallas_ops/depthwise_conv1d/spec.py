"""Depthwise 1D convolution, 'same' padding: out[t, c] = sum_k x[t + k - K//2, c] * w[k, c]."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x, w):
    """x (L, C) time-major, w (K, C) one odd-length filter per channel; returns (L, C)."""
    out = jax.lax.conv_general_dilated(
        x.astype(jnp.float32)[None],
        w.astype(jnp.float32)[:, None, :],
        window_strides=(1,),
        padding="SAME",
        dimension_numbers=("NWC", "WIO", "NWC"),
        feature_group_count=x.shape[1],
        precision=jax.lax.Precision.HIGHEST,
    )
    return out[0].astype(x.dtype)


def make_inputs(case, key):
    kx, kw = jax.random.split(key)
    length, c, k = case.dims["L"], case.dims["C"], case.dims["K"]
    x = jax.random.normal(kx, (length, c), jnp.float32)
    w = jax.random.normal(kw, (k, c), jnp.float32) / k**0.5
    return (x.astype(case.dtype), w.astype(case.dtype))


SPEC = OpSpec(
    name="depthwise_conv1d",
    category="convolution",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"L": 128, "C": 128, "K": 5})],
    extended=[
        Case("ragged", {"L": 75, "C": 160, "K": 5}),
        Case("bf16", {"L": 128, "C": 128, "K": 7}, dtype="bfloat16"),
    ],
    tolerance={"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)},
    description="Per-channel 1D convolution with 'same' zero padding, tiled over time, channels.",
)
