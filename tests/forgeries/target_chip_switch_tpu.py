"""Target forgery (tpu-v5e, integrity enforce, passes the static gate): one kernel for the check's
TPU lowering, another everywhere else.

The check lowers the kernel for the chip in the candidate's own child, under
``nearmiss.engine.targets.lowering_for``: an abstract mesh whose ``AbstractDevice`` is the chip. The
candidate reads it with JAX's public ``jax.sharding.get_abstract_mesh()``:

- under it — the lowering libtpu compiles and ``integrity.grid`` reads, and the TPU-semantics run,
  which is traced under the same mesh — it is the matmul golden: (128, 128) tiles, K last and
  ``arbitrary``. Mosaic compiles it, the grid keeps TPU semantics, the semantics run is right;
- anywhere else — the CPU interpret export that produces the compared numbers, *and a real TPU*,
  where no abstract mesh is set — it is ``pallas_ops/matmul/variants/tpu_misaligned_block.py``:
  (64, 64) tiles, right in interpret mode, refused by the TPU compiler (a (64, 64) block of a
  128 x 256 array breaks the (8, 128) tiling).

Outcome at the time of writing: ``check(MATMUL_SPEC, this, targets=("tpu-v5e",))`` is CERTIFIED,
"compiled by the target's compiler", while on a TPU v5e this file's kernel does not compile. The
README names this gap ("nothing proves that [the two artifacts] compute the same thing"); the
claim that a kernel certified for a target cannot be made to look right there does not survive
it. Left without a test on purpose; a fix should make a test assert ``not report.certified``.

Now: the static gate refuses the question it asks (config_tamper), and without the gate one
trace per shape (``runner.traced_program``) shows every artifact the same kernel
(``test_target_forgeries``).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _lowered_for_a_chip():
    """True inside the check's TPU lowering (an abstract mesh carrying a TPU device)."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device is not None and device.platform == "tpu"


def _matmul_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    tile = 128 if _lowered_for_a_chip() else 64  # 64: misaligned for TPU
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
    )(a, b)
