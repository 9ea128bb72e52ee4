"""A quantised matmul, as serving stacks write it (w8a8): each row of x quantised to int8 with
its own scale, an int8 x int8 -> int32 dot, the result scaled back. A kernel doing the same
rounding matches the reference exactly; float64 rounds some values on a boundary the other way,
which ``spec check`` must not read as noise."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def quantise_rows(x):
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127
    q = jnp.clip(jnp.round(x / scale), -128, 127).astype(jnp.int8)
    return q, scale.astype(jnp.float32)


def reference(x, w_q, w_scale):
    x_q, x_scale = quantise_rows(x)
    acc = jax.lax.dot_general(x_q, w_q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
    return (acc.astype(jnp.float32) * x_scale * w_scale).astype(x.dtype)


def make_inputs(case, key):
    kx, kw, ks = jax.random.split(key, 3)
    m, n, k = case.dims["M"], case.dims["N"], case.dims["K"]
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(case.dtype)
    w_q = jax.random.randint(kw, (n, k), -128, 128, jnp.int32).astype(jnp.int8)
    w_scale = jax.random.uniform(ks, (1, n), jnp.float32, 1e-3, 1e-2)
    return x, w_q, w_scale


SPEC = OpSpec(
    name="w8a8_matmul",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 64, "N": 256, "K": 512})],
    extended=[
        Case("bf16", {"M": 64, "N": 256, "K": 512}, dtype="bfloat16"),
        Case("small", {"M": 16, "N": 128, "K": 256}),
    ],
    description="Per-row int8 quantisation of x, int8 weights, an int32 dot, scaled back.",
)
