"""The VMEM estimate (``nearmiss.engine.targets.vmem``) against libtpu's compiler, on every TPU
target.

libtpu states a kernel's scoped VMEM only when it overflows; the estimate says it for every
kernel, so the check can warn before the next larger block overflows. These tests hold the
estimate to the compiler: kernels of known blocks (f32 and bf16, grids of one point and of
several, with and without ``vmem_limit_bytes``, with scratch) are compiled for each chip; each
overflow's size and limit, as the compiler states them, must be the estimate's, and the
estimate must say which kernels compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import OPS, PLANTED, ROOT
from nearmiss.engine.check import check
from nearmiss.engine.targets.registry import TPU_TARGETS
from nearmiss.engine.targets.vmem import MIB, close_to_limit, memref_bytes, vmem_use
from nearmiss.reports.text import render_report

MEASURE = r"""
import json, sys
from nearmiss.engine.targets import prepare_environment
prepare_environment()
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from nearmiss.engine.targets import compile_tpu_artifact, export_for_tpu
from nearmiss.engine.targets.registry import TPU_TARGETS

def kernel_for(rows, grid, dtype, scratch_rows, limit):
    def body(x_ref, o_ref, *scratch):
        o_ref[...] = x_ref[...] * 2
        if scratch:
            scratch[0][0:8, :] = x_ref[0:8, :].astype(jnp.float32)
            o_ref[0:8, :] = scratch[0][0:8, :].astype(o_ref.dtype)
    extra = {}
    if scratch_rows:
        extra["scratch_shapes"] = [pltpu.VMEM((scratch_rows, 512), jnp.float32)]
    params = pltpu.CompilerParams(vmem_limit_bytes=limit) if limit else None
    spec = pl.BlockSpec((rows, 512), lambda i: (i, 0))
    def f(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(grid,), in_specs=[spec], out_specs=spec, compiler_params=params, **extra)(x)
    return f, [jax.ShapeDtypeStruct((rows * grid, 512), dtype)]

rows = []
cases, others = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for target in TPU_TARGETS:
    for case in cases if target == "tpu-v5e" else [cases[i] for i in others]:
        f, avals = kernel_for(**case)
        compiled = compile_tpu_artifact(export_for_tpu(f, avals, target), target)
        rows.append({"target": target, "case": case, "ok": compiled["ok"],
                     "memory": compiled["memory"], "error": compiled["error"]})
print(json.dumps(rows))
"""

F32, BF16 = "float32", "bfloat16"
# (block rows of 512 columns, grid points, dtype, scratch rows, vmem_limit_bytes)
CASES = [
    dict(rows=1024, grid=2, dtype=F32, scratch_rows=0, limit=None),  # 8 MiB: half of 16
    dict(rows=1792, grid=2, dtype=F32, scratch_rows=0, limit=None),  # 14 MiB
    dict(rows=2048, grid=2, dtype=F32, scratch_rows=0, limit=None),  # 16 MiB: at the limit
    dict(rows=4096, grid=2, dtype=F32, scratch_rows=0, limit=None),  # 32 MiB
    dict(rows=4096, grid=1, dtype=F32, scratch_rows=0, limit=None),  # one point: 16 MiB
    dict(rows=8192, grid=1, dtype=F32, scratch_rows=0, limit=None),  # one point: 32 MiB
    dict(rows=8192, grid=2, dtype=BF16, scratch_rows=0, limit=None),  # 32 MiB of bf16
    dict(rows=4096, grid=2, dtype=F32, scratch_rows=4096, limit=None),  # + 8 MiB of scratch
    dict(rows=4096, grid=2, dtype=F32, scratch_rows=0, limit=64 * MIB),
    dict(rows=3584, grid=2, dtype=F32, scratch_rows=0, limit=32 * MIB),
    dict(rows=8192, grid=2, dtype=F32, scratch_rows=0, limit=None),  # 64 MiB: over v6e's 32
]
# The whole list on v5e; on the other chips (to keep the compiles few) the cases where their
# limits differ: 14, 32 and 64 MiB, blocks with scratch, and a 64 MiB vmem_limit_bytes.
ON_EVERY_CHIP = [1, 3, 7, 8, 10]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    scratch = tmp_path_factory.mktemp("vmem")
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(scratch))
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(CASES), json.dumps(ON_EVERY_CHIP)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=scratch,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.splitlines()[-1])
    assert len(rows) == len(CASES) + len(ON_EVERY_CHIP) * (len(TPU_TARGETS) - 1)
    return rows


def test_the_estimate_is_the_size_the_compiler_states_when_a_kernel_overflows(measured):
    overflows = [r for r in measured if not r["ok"]]
    assert all("vmem" in r["error"] for r in overflows)
    # (v4 names one allocation instead of the total for its largest overflow: no figure then.)
    stated = [r for r in overflows if "vmem_bytes" in r["memory"]]
    assert {r["target"] for r in stated} == set(TPU_TARGETS)  # every chip states some
    for row in stated:
        memory = row["memory"]
        assert memory["vmem_bytes"] == memory["vmem_blocks_bytes"], row
        assert memory["vmem_limit_bytes"] > 0, row


def test_the_estimate_says_which_kernels_compile_on_every_chip(measured):
    for row in measured:
        memory = row["memory"]
        fits = memory["vmem_blocks_bytes"] <= memory["vmem_limit_bytes"]
        assert fits == row["ok"], row
    by = {(r["target"], json.dumps(r["case"], sort_keys=True)): r for r in measured}

    def row(target: str, case: int) -> dict:
        return by[(target, json.dumps(CASES[case], sort_keys=True))]

    # Pipelined blocks count twice, a one-point grid's once; bf16 half of f32's bytes.
    assert row("tpu-v5e", 1)["memory"]["vmem_blocks_bytes"] == 14 * MIB
    assert row("tpu-v5e", 4)["memory"]["vmem_blocks_bytes"] == 16 * MIB
    assert row("tpu-v5e", 6)["memory"]["vmem_blocks_bytes"] == 32 * MIB
    # Scratch is reported on its own: the compiler does not count it (v6e's 32 MiB of blocks
    # and 8 MiB of scratch compile within 32 MiB).
    v6e = row("tpu-v6e", 7)
    assert v6e["ok"] and v6e["memory"]["vmem_scratch_bytes"] == 8 * MIB
    # vmem_limit_bytes raises the limit, up to what the chip has: v4's VMEM is 16 MiB.
    assert row("tpu-v5e", 8)["ok"] and row("tpu-v5e", 8)["memory"]["vmem_limit_bytes"] == 64 * MIB
    assert not row("tpu-v4", 8)["ok"]
    assert row("tpu-v4", 8)["memory"]["vmem_limit_bytes"] == 16 * MIB


def test_a_kernel_that_compiles_close_to_the_limit_is_warned_about(measured):
    for row in measured:
        warning = close_to_limit(row["memory"], row["target"])
        share = row["memory"]["vmem_blocks_bytes"] / row["memory"]["vmem_limit_bytes"]
        assert (warning is not None) == (row["ok"] and share >= 0.8), row
    warning = close_to_limit(
        next(r for r in measured if r["target"] == "tpu-v5e" and r["case"] == CASES[1])["memory"],
        "tpu-v5e",
    )
    assert warning.startswith("VMEM close to the limit on tpu-v5e: the blocks take 14.0 MiB of")


def test_an_unreadable_artifact_has_no_estimate_and_raises_nothing():
    # The artifact is written by the candidate's child: whatever it holds, the compiler's
    # verdict stands alone when the estimate cannot be made.
    assert vmem_use("not a module", "v5e") == {}
    forged = 'func.func @main() { "stablehlo.custom_call"() : () -> () return }'
    assert vmem_use(forged, "v5e") == {}


def test_memref_sizes():
    assert memref_bytes("memref<128x256xbf16, #tpu.memory_space<vmem>>") == (65536, "vmem")
    assert memref_bytes("memref<4xi32, #tpu.memory_space<smem>>") == (16, "smem")
    assert memref_bytes("memref<8x128xf8E4M3FN>") == (1024, "vmem")
    assert memref_bytes("memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>") is None
    assert memref_bytes("memref<?x128xf32>") is None


def test_a_check_reports_the_vmem_figures_the_warning_and_emulated_times():
    spec = OPS / "leaky_relu" / "spec.py"
    close = check(spec, PLANTED / "tpu_vmem_close.py", "compact", 1, targets=("tpu-v5e",))
    target = close.targets["tpu-v5e"]
    assert close.certified and target.ok, target
    assert target.memory["vmem_blocks_bytes"] == 14 * MIB
    assert any(n.startswith("VMEM close to the limit on tpu-v5e") for n in target.notes)
    # The text report says it too, and that the case times are the interpreter's, not a chip's.
    shown = render_report(close)
    assert "blocks 14.0 of 16.0 MiB VMEM" in shown and "note: VMEM close to the limit" in shown
    assert close.times == "emulated" and "case times emulated (CPU interpret mode)" in shown
