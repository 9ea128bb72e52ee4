"""Paged decode attention (ejkernel's TPU paged flash attention kernel): each of B sequences has
one query token per head, attending over the first context_lens[b] tokens of its pages in the
cache (the page table block_tables is shuffled; tokens past the length are cache garbage and
must be masked); grouped-query heads (G query heads per KV head), softmax scale 1/sqrt(D).

query (B, KVH * G, D); key and value caches (KVH, pages, PAGE, D); context_lens (B,) int32,
none a multiple of the kernel's 32-token compute block; block_tables (B, P) int32."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

PAGE = 16
SPARE_PAGES = 3
HIGHEST = jax.lax.Precision.HIGHEST


def reference(query, k_cache, v_cache, context_lens, block_tables):
    b, hq, d = query.shape
    kvh = k_cache.shape[0]
    k = k_cache[:, block_tables].reshape(kvh, b, -1, d).astype(jnp.float32)  # (KVH, B, T, D)
    v = v_cache[:, block_tables].reshape(kvh, b, -1, d).astype(jnp.float32)
    k, v = (jnp.repeat(x, hq // kvh, axis=0) for x in (k, v))  # query head h reads kv head h // G
    s = jnp.einsum("bhd,hbtd->bht", query.astype(jnp.float32), k, precision=HIGHEST)
    s = s / math.sqrt(d)
    keep = jnp.arange(k.shape[2])[None, None, :] < context_lens[:, None, None]
    p = jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1)
    return jnp.einsum("bht,hbtd->bhd", p, v, precision=HIGHEST).astype(query.dtype)


def make_inputs(case, key):
    kq, kk, kv, kp, kl = jax.random.split(key, 5)
    b, kvh, g, d, pages = (case.dims[n] for n in ("B", "KVH", "G", "D", "P"))
    total = b * pages + SPARE_PAGES
    query = jax.random.normal(kq, (b, kvh * g, d), jnp.float32)
    k_cache = jax.random.normal(kk, (kvh, total, PAGE, d), jnp.float32)
    v_cache = jax.random.normal(kv, (kvh, total, PAGE, d), jnp.float32)
    block_tables = jax.random.permutation(kp, total)[: b * pages].reshape(b, pages)
    lengths = jax.random.randint(kl, (b,), 1, pages * PAGE)
    lengths = jnp.where(lengths % 32 == 0, lengths + 1, lengths)  # never a whole compute block
    return (
        query.astype(case.dtype),
        k_cache.astype(case.dtype),
        v_cache.astype(case.dtype),
        lengths.astype(jnp.int32),
        block_tables.astype(jnp.int32),
    )


SPEC = OpSpec(
    name="ej_paged_decode",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 2, "KVH": 2, "G": 2, "D": 64, "P": 8})],
    extended=[Case("more_sequences", {"B": 3, "KVH": 1, "G": 4, "D": 64, "P": 8})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="ejkernel's paged flash attention decode kernel (TPU Pallas), GQA, ragged lengths",
)
