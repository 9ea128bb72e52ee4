"""Attention over each sequence's valid prefix: batch row b attends to keys j < lengths[b].

q (B, Q, D), k and v (B, S, D), lengths (B,) int32 in [1, S]: keys at or past a row's length
are padding, filled with values the kernel must ignore (they would change every output).
"""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(q, k, v, lengths):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bqd,bkd->bqk", qf, kf) / math.sqrt(q.shape[-1])
    valid = jnp.arange(k.shape[1])[None, None, :] < lengths[:, None, None]
    s = jnp.where(valid, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bqk,bkd->bqd", p, vf).astype(q.dtype)


def make_inputs(case, key):
    kq, kk, kv, kl = jax.random.split(key, 4)
    b, nq, s, d = case.dims["B"], case.dims["Q"], case.dims["S"], case.dims["D"]
    q = jax.random.normal(kq, (b, nq, d), jnp.float32)
    k = jax.random.normal(kk, (b, s, d), jnp.float32)
    v = jax.random.normal(kv, (b, s, d), jnp.float32)
    # Row 0 uses the whole sequence (the ragged tail matters), row 1 two whole blocks of 128,
    # the others a random prefix: which rows fail tells a bug at the length from one at a block.
    lengths = jax.random.randint(kl, (b,), 1, s + 1).at[0].set(s).at[1].set(256)
    return (
        q.astype(case.dtype),
        k.astype(case.dtype),
        v.astype(case.dtype),
        lengths.astype(jnp.int32),
    )


SPEC = OpSpec(
    name="length_masked_attention",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 4, "Q": 8, "S": 512, "D": 128})],
    extended=[
        Case("ragged", {"B": 3, "Q": 8, "S": 400, "D": 128}),
        Case("bf16", {"B": 4, "Q": 8, "S": 512, "D": 128}, dtype="bfloat16"),
    ],
    tolerance={"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 2e-2)},
    description="Decode-style attention over per-row valid prefixes (lengths), written the way "
    "JAX's TPU kernels are: scalar prefetch, a grid_spec, named masks, scratch accumulators.",
)
