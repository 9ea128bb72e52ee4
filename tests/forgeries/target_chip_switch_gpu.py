"""Target forgery (gpu, integrity enforce, passes the static gate): one kernel for the check's TPU
lowering, another everywhere else.

The ``gpu`` target is judged by the grid of a *TPU* lowering that the candidate's own child
exports, under ``nearmiss.engine.targets.lowering_for``: an abstract mesh whose ``AbstractDevice``
is the chip. The candidate reads that mesh with JAX's public ``jax.sharding.get_abstract_mesh()``:

- under it (the lowering that gives the ``gpu`` verdict its grid), K is reduced inside one
  program: the grid is (M/BM, N/BN), every output block is written by exactly one grid point,
  ``integrity.grid`` finds no race;
- anywhere else — the CPU interpret export that produces the compared numbers, *and a real GPU*,
  where no abstract mesh is set — it is the matmul golden: K is a grid axis and every program
  along it does ``o_ref[...] += ...`` on one output block. Right in program order (interpret
  mode), a race where GPU programs run concurrently.

Outcome at the time of writing: ``check(MATMUL_SPEC, this, targets=("gpu",))`` is CERTIFIED
(numbers right, integrity clean, gpu ok), while the code a GPU runs is the golden that
``test_check_targets`` shows racing on a GPU.

Now: the static gate refuses the question it asks (config_tamper), and without the gate one
trace per shape (``runner.traced_program``) shows every artifact the same kernel
(``test_target_forgeries``).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM, BN, BK = 128, 128, 128


def _lowered_for_a_chip():
    """True inside the check's TPU lowering (an abstract mesh carrying a TPU device)."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device is not None and device.platform == "tpu"


def _k_across_the_grid(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def _k_in_one_program(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    if _lowered_for_a_chip():
        return pl.pallas_call(
            _k_in_one_program,
            grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
            in_specs=[
                pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((k, bn), lambda i, j: (0, j)),
            ],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        )(a, b)
    return pl.pallas_call(
        _k_across_the_grid,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(a, b)
