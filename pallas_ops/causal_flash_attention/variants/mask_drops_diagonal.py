"""Bug: the causal mask is col < row, so each query loses its own key and query 0 sees none."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BQ, BK = 32, 32
MASK_VALUE = -1e30


def _causal_flash_body(q_ref, k_ref, v_ref, o_ref, *, seq_len):
    qi = pl.program_id(1)
    q = q_ref[...].astype(jnp.float32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    # Global query positions of this block's rows.
    row = qi * BQ + jax.lax.broadcasted_iota(jnp.int32, (BQ, BK), 0)

    def step(j, carry):
        m_prev, l_prev, acc_prev = carry
        start = pl.multiple_of(j * BK, BK)
        k = k_ref[pl.ds(start, BK), :].astype(jnp.float32)
        v = v_ref[pl.ds(start, BK), :].astype(jnp.float32)
        s = jax.lax.dot_general(
            q,
            k,
            (((1,), (1,)), ((), ())),
            preferred_element_type=jnp.float32,
            precision=jax.lax.Precision.HIGHEST,
        )
        s = s * scale
        # Global key positions: causal mask, and keys past seq_len (zero padding) masked out.
        col = start + jax.lax.broadcasted_iota(jnp.int32, (BQ, BK), 1)
        s = jnp.where((col < row) & (col < seq_len), s, MASK_VALUE)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        acc_new = alpha * acc_prev + jnp.dot(
            p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST
        )
        return m_new, l_new, acc_new

    # Only KV blocks that start at or before this query block's last row contribute.
    num_kv = jnp.minimum(pl.cdiv((qi + 1) * BQ, BK), k_ref.shape[0] // BK)
    init = (
        jnp.full((BQ, 1), -jnp.inf, jnp.float32),
        jnp.zeros((BQ, 1), jnp.float32),
        jnp.zeros((BQ, q.shape[-1]), jnp.float32),
    )
    _, l_final, acc = jax.lax.fori_loop(0, num_kv, step, init)
    o_ref[...] = (acc / l_final).astype(o_ref.dtype)


def kernel(q, k, v):
    heads, seq, dim = q.shape
    # Pad K and V to whole KV blocks so every pl.ds slice in the loop stays in bounds.
    padded = pl.cdiv(seq, BK) * BK
    pad = ((0, 0), (0, padded - seq), (0, 0))
    k_pad, v_pad = jnp.pad(k, pad), jnp.pad(v, pad)
    body = functools.partial(_causal_flash_body, seq_len=seq)
    return pl.pallas_call(
        body,
        grid=(heads, pl.cdiv(seq, BQ)),
        in_specs=[
            pl.BlockSpec((None, BQ, dim), lambda h, i: (h, i, 0)),
            pl.BlockSpec((None, padded, dim), lambda h, i: (h, 0, 0)),
            pl.BlockSpec((None, padded, dim), lambda h, i: (h, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, BQ, dim), lambda h, i: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, k_pad, v_pad)
