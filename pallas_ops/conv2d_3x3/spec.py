"""3x3 convolution, 'same' zero padding, few channels: x (Cin, H, W), w (Cout, Cin, 3, 3)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x, w):
    out = jax.lax.conv_general_dilated(
        x.astype(jnp.float32)[None],
        w.astype(jnp.float32),
        window_strides=(1, 1),
        padding="SAME",
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jax.lax.Precision.HIGHEST,
    )
    return out[0].astype(x.dtype)


def make_inputs(case, key):
    kx, kw = jax.random.split(key)
    c, h, width = case.dims["C"], case.dims["H"], case.dims["W"]
    x = jax.random.normal(kx, (c, h, width), jnp.float32)
    w = jax.random.normal(kw, (c, c, 3, 3), jnp.float32) / (9 * c) ** 0.5
    return (x.astype(case.dtype), w.astype(case.dtype))


SPEC = OpSpec(
    name="conv2d_3x3",
    category="convolution",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"C": 4, "H": 32, "W": 32})],
    extended=[
        Case("ragged", {"C": 3, "H": 21, "W": 20}),
        Case("bf16", {"C": 4, "H": 32, "W": 48}, dtype="bfloat16"),
    ],
    # bf16: one final rounding of a float32 sum (up to 1 ulp apart from the reference's) passes;
    # rounding the running sum to bf16 tap after tap does not.
    tolerance={"float32": (1e-5, 1e-5), "bfloat16": (4e-3, 8e-3)},
    description="Dense 3x3 convolution over a few channels with 'same' padding, tiled over rows.",
)
