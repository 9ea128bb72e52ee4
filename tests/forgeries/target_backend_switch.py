"""Target forgery (tpu-v5e, integrity enforce, passes the static gate): the kernel asks JAX
which platform it runs on, and the check never traces it on the target's platform.

Every trace the check makes happens in a child whose backend is the CPU (the TPU lowering is
compile-only; the ``gpu`` verdict is a TPU lowering's grid), so ``jax.default_backend()`` is
``"cpu"`` in all of them. This file is the matmul golden whenever it is traced on a CPU, and on
any other backend a kernel with (64, 64) tiles — misaligned for TPU, refused by its compiler —
and K declared ``parallel``.

Outcome at the time of writing: CERTIFIED for tpu-v5e (every artifact the check sees is the
golden: it compiles, keeps TPU semantics, is right under TPU interpret mode), while traced on a
real TPU the same file builds a kernel the TPU compiler refuses. The same two lines make any
kernel certified for ``gpu`` race there (``== "cpu"`` picks the race-free kernel). No check of
artifacts made on a CPU can see this: the certificate is about a Python file whose behaviour on
the target's own backend is never observed. Left without a test on purpose. A fix is outside
the artifacts: refuse platform queries in the static gate (``jax.default_backend``,
``jax.devices``/``local_devices``, ``.platform``, ``.device_kind``, ``get_abstract_mesh``,
``pltpu.get_tpu_info``/``is_tpu_device``, ``jax.extend.backend``...), and/or certify and ship
the exported artifact (its digest in the certificate) rather than the source.

Now: the static gate refuses the question it asks (config_tamper, ``test_target_forgeries``).
One trace per shape does not help here: every trace is made on a CPU host.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    checked_here = jax.default_backend() == "cpu"
    tile = 128 if checked_here else 64
    k_axis = "arbitrary" if checked_here else "parallel"
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(tile, m), min(tile, n), min(tile, k)
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", k_axis)),
    )(a, b)
