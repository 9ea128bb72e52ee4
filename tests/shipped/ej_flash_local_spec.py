"""Causal local attention over (B, H, S, D): each query attends to itself and the WINDOW keys
before it, softmax(q k^T / sqrt(D)) v (ejkernel's TPU flash attention with causal=True and
sliding_window=(WINDOW, 0)), S = 256: the entry's 256-key block takes the kernel's single-step
path (the multi-step one calls ``pltpu.repeat``, which JAX 0.10 no longer has), two 128-row
query blocks; the window shuts out most of the first query block's keys for the second."""

import math

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

WINDOW = 96
HIGHEST = jax.lax.Precision.HIGHEST


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf, precision=HIGHEST) / math.sqrt(q.shape[-1])
    rows = jnp.arange(q.shape[2])[:, None]
    cols = jnp.arange(k.shape[2])[None, :]
    keep = (cols <= rows) & (cols >= rows - WINDOW)
    p = jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, vf, precision=HIGHEST).astype(q.dtype)


def make_inputs(case, key):
    ks = jax.random.split(key, 3)
    shape = (case.dims["B"], case.dims["H"], case.dims["S"], case.dims["D"])
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(case.dtype) for k in ks)


SPEC = OpSpec(
    name="ej_flash_local",
    category="attention",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"B": 1, "H": 2, "S": 256, "D": 128})],
    extended=[Case("batched", {"B": 2, "H": 1, "S": 256, "D": 128})],
    tolerance={"float32": (2e-4, 2e-4)},
    description="ejkernel's TPU flash attention forward, causal with a 96-key sliding window",
)
