"""Chunked-prefill attention over a paged KV cache (ejkernel's TPU chunked prefill kernel): the
last C of L context tokens attend, each to the keys at or before its own position and within the
WINDOW tokens ending there, over a cache whose pages sit in a shuffled page table; grouped-query
heads (G query heads per KV head), softmax scale 1/sqrt(D).

query (C, KVH * G, D); key and value caches (KVH, pages, PAGE, D); context_len (1,) int32;
page_indices (pages of the sequence,) int32, enough whole C-token chunks to hold L tokens (the
tokens past L in the last chunk are cache garbage and must be masked).

One KV head (KVH = 1): the kernel fetches a head's first chunk only at grid step 0 (its
``prefetch_first_kv`` runs when ``h == 0``), so with more KV heads the later ones read the
previous head's buffer wherever the window reaches the first chunk (found while writing this
spec; measured at L=200, KVH=2: heads 2-3 rows 0-26 wrong)."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

PAGE = 16
WINDOW = 100
SPARE_PAGES = 4
HIGHEST = jax.lax.Precision.HIGHEST


def reference(query, k_cache, v_cache, context_len, page_indices):
    c, hq, d = query.shape
    kvh = k_cache.shape[0]
    length = context_len[0]
    k = k_cache[:, page_indices].reshape(kvh, -1, d).astype(jnp.float32)
    v = v_cache[:, page_indices].reshape(kvh, -1, d).astype(jnp.float32)
    k, v = (jnp.repeat(x, hq // kvh, axis=0) for x in (k, v))  # query head h reads kv head h // G
    s = jnp.einsum("chd,hkd->hck", query.astype(jnp.float32), k, precision=HIGHEST) / math.sqrt(d)
    q_pos = length - c + jnp.arange(c)[:, None]
    k_pos = jnp.arange(k.shape[1])[None, :]
    keep = (k_pos <= q_pos) & (k_pos < length) & (k_pos > q_pos - WINDOW)
    p = jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1)
    return jnp.einsum("hck,hkd->chd", p, v, precision=HIGHEST).astype(query.dtype)


def make_inputs(case, key):
    kq, kk, kv, kp = jax.random.split(key, 4)
    c, length, kvh, g, d = (case.dims[n] for n in ("C", "L", "KVH", "G", "D"))
    pages = -(-length // c) * (c // PAGE)  # whole chunks
    total = pages + SPARE_PAGES
    query = jax.random.normal(kq, (c, kvh * g, d), jnp.float32)
    k_cache = jax.random.normal(kk, (kvh, total, PAGE, d), jnp.float32)
    v_cache = jax.random.normal(kv, (kvh, total, PAGE, d), jnp.float32)
    page_indices = jax.random.permutation(kp, total)[:pages].astype(jnp.int32)
    context_len = jnp.array([length], jnp.int32)
    return (
        query.astype(case.dtype),
        k_cache.astype(case.dtype),
        v_cache.astype(case.dtype),
        context_len,
        page_indices,
    )


SPEC = OpSpec(
    name="ej_prefill_paged",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("ragged_context", {"C": 64, "L": 200, "KVH": 1, "G": 4, "D": 64})],
    extended=[Case("aligned_context", {"C": 64, "L": 256, "KVH": 1, "G": 2, "D": 64})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="ejkernel's chunked-prefill paged attention (TPU Pallas), GQA and a sliding window",
)
