"""Row-wise L2 normalisation: each row divided by max(its Euclidean norm, eps)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

EPS = 1e-12


def reference(x):
    xf = x.astype(jnp.float32)
    sq = jnp.sum(jnp.square(xf), axis=-1, keepdims=True)
    return (xf * jax.lax.rsqrt(jnp.maximum(sq, EPS * EPS))).astype(x.dtype)


def make_inputs(case, key):
    rows, cols = case.dims["R"], case.dims["C"]
    x = jax.random.normal(key, (rows, cols), jnp.float32)
    if case.profile == "zero_rows":
        # All-zero rows (padding embeddings) must map to zero, not NaN.
        x = jnp.where((jnp.arange(rows) % 5 == 0)[:, None], 0.0, x)
    return (x.astype(case.dtype),)


SPEC = OpSpec(
    name="l2_normalize_rows",
    category="normalization",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"R": 64, "C": 256})],
    extended=[
        Case("ragged", {"R": 45, "C": 320}),
        Case("bf16", {"R": 64, "C": 256}, dtype="bfloat16"),
        Case("zero_rows", {"R": 40, "C": 128}, profile="zero_rows"),
    ],
    tolerance={"float32": (1e-5, 1e-5), "bfloat16": (1e-2, 1e-2)},
    description="Row-wise L2 normalisation: x / max(||x||_2, eps) over the last axis.",
)
