"""Layer norm over the last axis of (B, S, C), weight and bias, eps 1e-5, with all-zero rows
(padding tokens) and a width no power of two (JAX's gpu/layer_norm.py)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-5


def reference(x, weight, bias):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + EPS) * weight.astype(jnp.float32)
    return (y + bias.astype(jnp.float32)).astype(x.dtype)


def make_inputs(case, key):
    kx, kw, kb = jax.random.split(key, 3)
    b, s, c = case.dims["B"], case.dims["S"], case.dims["C"]
    x = 1.0 + jax.random.normal(kx, (b, s, c), jnp.float32)
    x = jnp.where((jnp.arange(s) % 4 == 0)[None, :, None], 0.0, x)  # padding tokens
    w = 1.0 + 0.1 * jax.random.normal(kw, (c,), jnp.float32)
    bias = 0.1 * jax.random.normal(kb, (c,), jnp.float32)
    return (x.astype(case.dtype), w.astype(case.dtype), bias.astype(case.dtype))


SPEC = OpSpec(
    name="wild_gpu_layer_norm",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("zero_rows", {"B": 2, "S": 8, "C": 200}, profile="zero_rows")],
    tolerance={"float32": (1e-5, 1e-5)},
    description="JAX's shipped ops/gpu/layer_norm.py on padding rows and a ragged width",
)
