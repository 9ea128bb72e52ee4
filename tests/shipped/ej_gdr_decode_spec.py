"""One decode step of the gated delta rule, per token and head (ejkernel's ragged GDR decode
kernel): with q scaled by 1/sqrt(Dk), g = exp(clip(decay, -20, 20)) and S the token's state
(Dk, Dv),

    v_new  = beta * (v - g * S^T k)
    out    = g * S^T q + (q . k) * v_new
    S_next = g * S + k v_new^T

q and k (T, H, Dk), v (T, H, Dv), beta and decay (T, H), the state (T, H, Dk, Dv); returns
(out, S_next)."""

import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec

HIGHEST = jax.lax.Precision.HIGHEST


def reference(q, k, v, beta, decay, state):
    qf, kf, vf, s = (x.astype(jnp.float32) for x in (q, k, v, state))
    qf = qf / jnp.sqrt(jnp.float32(q.shape[-1]))
    g = jnp.exp(jnp.clip(decay.astype(jnp.float32), -20.0, 20.0))[..., None]
    b = beta.astype(jnp.float32)[..., None]
    s_k = jnp.einsum("thkv,thk->thv", s, kf, precision=HIGHEST)
    s_q = jnp.einsum("thkv,thk->thv", s, qf, precision=HIGHEST)
    v_new = b * (vf - g * s_k)
    qk = jnp.sum(qf * kf, axis=-1, keepdims=True)
    out = g * s_q + qk * v_new
    s_next = g[..., None] * s + kf[..., :, None] * v_new[..., None, :]
    return out.astype(q.dtype), s_next.astype(state.dtype)


def make_inputs(case, key):
    kq, kk, kv, kb, kd, ks = jax.random.split(key, 6)
    t, h, dk, dv = case.dims["T"], case.dims["H"], case.dims["DK"], case.dims["DV"]
    q = jax.random.normal(kq, (t, h, dk), jnp.float32)
    k = jax.random.normal(kk, (t, h, dk), jnp.float32)
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)  # unit keys, as the delta rule uses
    v = jax.random.normal(kv, (t, h, dv), jnp.float32)
    beta = jax.nn.sigmoid(jax.random.normal(kb, (t, h), jnp.float32))
    decay = -jax.nn.softplus(jax.random.normal(kd, (t, h), jnp.float32))  # log decay, < 0
    state = 0.5 * jax.random.normal(ks, (t, h, dk, dv), jnp.float32)
    return tuple(x.astype(case.dtype) for x in (q, k, v, beta, decay, state))


SPEC = OpSpec(
    name="ej_gdr_decode",
    category="other",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"T": 4, "H": 2, "DK": 64, "DV": 64})],
    extended=[Case("wide_values", {"T": 6, "H": 3, "DK": 64, "DV": 128})],
    tolerance={"float32": (1e-4, 1e-4)},
    description="ejkernel's ragged gated-delta-rule decode kernel (one token per grid step)",
)
