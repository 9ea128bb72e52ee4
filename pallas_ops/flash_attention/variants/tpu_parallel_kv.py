"""Bug (TPU): all three grid axes are declared "parallel" in dimension_semantics, the KV axis
included. Right in interpret mode, which runs the grid in order, but the online softmax carries
m, l and acc in scratch from one KV step to the next and writes the output at the last one: TPU
may split or reorder a parallel axis, so the KV axis must be "arbitrary"."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BQ, BK = 32, 32
MASK_VALUE = -1e30


def _flash_body(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, seq_len):
    kv = pl.program_id(2)

    @pl.when(kv == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    q = q_ref[...].astype(jnp.float32)
    k = k_ref[...].astype(jnp.float32)
    v = v_ref[...].astype(jnp.float32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = jax.lax.dot_general(
        q,
        k,
        (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=jax.lax.Precision.HIGHEST,
    )
    s = s * scale
    # Keys past seq_len lie in the padding of the last KV block: mask them and zero their values.
    col = kv * BK + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(col < seq_len, s, MASK_VALUE)
    key_pos = kv * BK + jax.lax.broadcasted_iota(jnp.int32, (BK, 1), 0)
    v = jnp.where(key_pos < seq_len, v, 0.0)

    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
        p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST
    )
    m_ref[...] = m_new

    @pl.when(kv == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def kernel(q, k, v):
    heads, seq, dim = q.shape
    body = functools.partial(_flash_body, seq_len=seq)
    return pl.pallas_call(
        body,
        grid=(heads, pl.cdiv(seq, BQ), pl.cdiv(seq, BK)),
        in_specs=[
            pl.BlockSpec((None, BQ, dim), lambda h, i, j: (h, i, 0)),
            pl.BlockSpec((None, BK, dim), lambda h, i, j: (h, j, 0)),
            pl.BlockSpec((None, BK, dim), lambda h, i, j: (h, j, 0)),
        ],
        out_specs=pl.BlockSpec((None, BQ, dim), lambda h, i, j: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")
        ),
        scratch_shapes=[
            pltpu.VMEM((BQ, 1), jnp.float32),
            pltpu.VMEM((BQ, 1), jnp.float32),
            pltpu.VMEM((BQ, dim), jnp.float32),
        ],
    )(q, k, v)
