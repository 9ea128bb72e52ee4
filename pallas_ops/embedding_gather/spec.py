"""Embedding lookup: out[n, :] = table[ids[n], :] for a (V, D) table and int32 ids (N,)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(table, ids):
    return jnp.take(table, ids, axis=0)


def make_inputs(case, key):
    kt, ki = jax.random.split(key)
    v, d, n = case.dims["V"], case.dims["D"], case.dims["N"]
    table = jax.random.normal(kt, (v, d), jnp.float32).astype(case.dtype)
    if case.profile == "edge_ids":
        # Only the first and the last row of the table: off-by-one clamps and bounds show.
        ids = jnp.where(jax.random.bernoulli(ki, 0.5, (n,)), v - 1, 0).astype(jnp.int32)
    else:
        ids = jax.random.randint(ki, (n,), 0, v, jnp.int32)
    return (table, ids)


SPEC = OpSpec(
    name="embedding_gather",
    category="gather",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"V": 64, "D": 128, "N": 64})],
    extended=[
        Case("ragged", {"V": 100, "D": 200, "N": 50}),
        Case("bf16", {"V": 64, "D": 256, "N": 32}, dtype="bfloat16"),
        Case("edges", {"V": 64, "D": 128, "N": 64}, profile="edge_ids"),
    ],
    # A gather copies values: the result must be exact.
    tolerance={"float32": (0.0, 0.0), "bfloat16": (0.0, 0.0)},
    description="Row gather from an embedding table by int32 ids, one dynamic row load per id.",
)
