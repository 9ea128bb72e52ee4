"""Length-masked attention whose KV index map clamps with a floor: a row whose length is not a
multiple of the block re-reads the previous block for its last, partial one."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

DEFAULT_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
NT_DIMS = (((1,), (1,)), ((), ()))


def _attention_kernel(
    lengths_ref, q_ref, k_ref, v_ref, o_ref, m_scr, l_scr, acc_scr, *, block_k, sm_scale
):
    b = pl.program_id(0)
    kv_index = pl.program_id(1)
    length = lengths_ref[b]

    @pl.when(kv_index == 0)
    def _init():
        m_scr[...] = jnp.full_like(m_scr, DEFAULT_MASK_VALUE)
        l_scr[...] = jnp.zeros_like(l_scr)
        acc_scr[...] = jnp.zeros_like(acc_scr)

    @pl.when(kv_index * block_k < length)
    def _compute():
        q = q_ref[...].astype(jnp.float32)
        k = k_ref[...].astype(jnp.float32)
        s = (
            jax.lax.dot_general(
                q,
                k,
                NT_DIMS,
                preferred_element_type=jnp.float32,
                precision=jax.lax.Precision.HIGHEST,
            )
            * sm_scale
        )
        col = kv_index * block_k + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        mask = col < length
        s = s + jnp.where(mask, 0.0, DEFAULT_MASK_VALUE)
        m_prev, l_prev = m_scr[...], l_scr[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next)
        l_scr[...] = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        v = v_ref[...].astype(jnp.float32)
        pv = jnp.dot(p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
        acc_scr[...] = (alpha * acc_scr[...].astype(jnp.float32) + pv).astype(acc_scr.dtype)
        m_scr[...] = m_next

    @pl.when(kv_index == pl.num_programs(1) - 1)
    def _finish():
        o_ref[...] = (acc_scr[...].astype(jnp.float32) / l_scr[...]).astype(o_ref.dtype)


def length_masked_attention(
    q, k, v, lengths, *, block_k=128, sm_scale=None, acc_dtype=jnp.float32, interpret=False
):
    batch, num_q, dim = q.shape
    seq = k.shape[1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(dim)
    # Whole KV blocks: the additive mask cannot cancel the NaN an unwritten tail reads as.
    padded = pl.cdiv(seq, block_k) * block_k
    k = jnp.pad(k, ((0, 0), (0, padded - seq), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, padded - seq), (0, 0)))

    def kv_index_map(b, j, lengths_ref):
        # Blocks past the row's length are skipped by the body; fetch the last valid one again.
        last = jnp.maximum(lengths_ref[b] // block_k - 1, 0)
        return (b, jnp.minimum(j, last), 0)

    body = functools.partial(_attention_kernel, block_k=block_k, sm_scale=sm_scale)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(batch, pl.cdiv(seq, block_k)),
        in_specs=[
            pl.BlockSpec((None, num_q, dim), lambda b, j, lengths_ref: (b, 0, 0)),
            pl.BlockSpec((None, block_k, dim), kv_index_map),
            pl.BlockSpec((None, block_k, dim), kv_index_map),
        ],
        out_specs=pl.BlockSpec((None, num_q, dim), lambda b, j, lengths_ref: (b, 0, 0)),
        scratch_shapes=[
            pltpu.VMEM((num_q, 1), jnp.float32),
            pltpu.VMEM((num_q, 1), jnp.float32),
            pltpu.VMEM((num_q, dim), acc_dtype),
        ],
    )
    return pl.pallas_call(
        body,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(lengths, q, k, v)


def kernel(q, k, v, lengths):
    return length_masked_attention(q, k, v, lengths)
