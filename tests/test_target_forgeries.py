"""Target attacks: kernels wrong on their target, made to look right there.

A check for a target (``tpu-v5e``, ``tpu-v5p``, ``gpu``) adds, to the numbers of the CPU interpret
run, the chip's compiler and grid semantics on a TPU lowering the candidate's child exports, and
for TPU targets a run under JAX's TPU interpret mode in the candidate's child. Each test here runs
one hostile candidate (``tests/forgeries/target_*.py``; its docstring says what it tries) and
looks at the effect: the numbers are right in program order, and the target still refuses it.

Candidates in ``tests/forgeries/target_*.py`` without a test here are attacks that are still
CERTIFIED while wrong on their target (their docstrings say how): a fix should add their test,
asserting ``not report.certified``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import MATMUL_SPEC, OPS, PLANTED
from nearmiss.engine import check as check_module
from nearmiss.engine.check import check

FORGERIES = Path(__file__).resolve().parent / "forgeries"
DOUBLE_SPEC = PLANTED / "tpu_spec" / "spec.py"
CUMSUM_SPEC = OPS / "cumsum_rows" / "spec.py"
COL_SUM_SPEC = OPS / "col_sum" / "spec.py"
SHIFT_SPEC = FORGERIES / "target_shift_spec.py"
LEAKY_RELU_SPEC = OPS / "leaky_relu" / "spec.py"


@pytest.fixture
def no_static_gate(monkeypatch):
    monkeypatch.setattr(check_module, "static_violations", lambda source, name: [])


def right_in_program_order(report) -> bool:
    return bool(report.cases) and all(c.passed for c in report.cases) and report.integrity.ok


def refused_on_gpu(spec: Path, forgery: Path, suite: str, failure_class: str):
    """The gpu target's verdict on a forgery that every case and the interpret target pass:
    refused, with ``failure_class``."""
    report = check(spec, forgery, suite, 1, targets=("interpret", "gpu"))
    gpu = report.targets["gpu"]
    assert all(c.passed for c in report.cases) and report.targets["interpret"].ok
    assert not report.certified and not gpu.ok and gpu.failure_class == failure_class, gpu
    return gpu


def line_of(text: str, forgery: str) -> int:
    """The line of ``forgery`` where ``text`` first appears in its code (not its docstring)."""
    lines = (FORGERIES / forgery).read_text().splitlines()
    code = max(i for i, line in enumerate(lines) if line.startswith('"""') or line.endswith('"""'))
    return next(i for i, line in enumerate(lines, 1) if i > code and text in line)


def kinds(result) -> set[str]:
    return {finding["kind"] for finding in result.findings}


def test_a_carry_across_a_parallel_axis_is_stopped_by_the_tpu_semantics_run():
    # Each output block is written once, so the grid has nothing to say and Mosaic compiles it:
    # only the run under TPU interpret mode (two cores, random order) sees the lost carry.
    report = check(
        CUMSUM_SPEC, FORGERIES / "target_parallel_carry.py", "compact", 3, targets=("tpu-v5p",)
    )
    tpu = report.targets["tpu-v5p"]
    assert right_in_program_order(report)
    assert not report.certified and not tpu.ok and tpu.failure_class == "grid_race"
    assert kinds(tpu) & {"order_dependent", "race_detected"}, tpu.findings
    assert not kinds(tpu) & {"parallel_revisit", "nonconsecutive_revisit"}, tpu.findings


def test_a_carry_through_a_discarded_output_is_stopped_by_the_tpu_semantics_run():
    # The grid check lets an unused output's parallel revisits through (a note, not a finding):
    # the kernel reading its carry back from that block is core-local state, as scratch is.
    report = check(
        CUMSUM_SPEC, FORGERIES / "target_dead_output_carry.py", "compact", 3, targets=("tpu-v5p",)
    )
    tpu = report.targets["tpu-v5p"]
    assert right_in_program_order(report)
    assert not report.certified and not tpu.ok and tpu.failure_class == "grid_race"
    assert kinds(tpu) & {"order_dependent", "race_detected"}, tpu.findings
    assert any("nothing uses that output" in note for note in tpu.notes), tpu.notes


def test_an_output_written_by_dma_leaves_the_grid_undetermined_not_clean():
    report = check(
        DOUBLE_SPEC,
        FORGERIES / "target_any_output.py",
        "compact",
        3,
        targets=("tpu-v5p", "gpu"),
    )
    assert right_in_program_order(report)
    assert not report.certified
    for name in ("tpu-v5p", "gpu"):
        result = report.targets[name]
        assert not result.ok, (name, result)
        # (for gpu its DMA semaphores, in scratch, are already reason enough)
        reasons = " ".join(result.undetermined)
        assert "ANY" in reasons or (name == "gpu" and "scratch" in reasons), (name, reasons)


def test_a_revisit_behind_a_scalar_prefetch_table_leaves_the_grid_undetermined():
    report = check(
        DOUBLE_SPEC,
        FORGERIES / "target_prefetch_index.py",
        "compact",
        3,
        targets=("tpu-v5p", "gpu"),
    )
    assert right_in_program_order(report)
    assert not report.certified
    for name in ("tpu-v5p", "gpu"):
        result = report.targets[name]
        assert not result.ok, (name, result)
        assert any("scalar-prefetch" in r for r in result.undetermined), (name, result.undetermined)


def test_a_racing_kernel_inside_a_branch_after_a_harmless_one_is_found():
    report = check(
        MATMUL_SPEC, FORGERIES / "target_nested_kernels.py", "compact", 3, targets=("gpu",)
    )
    gpu = report.targets["gpu"]
    assert right_in_program_order(report)
    assert not report.certified and not gpu.ok and gpu.failure_class == "grid_race"
    race = next(f for f in gpu.findings if f["kind"] == "grid_race")
    assert race["kernel_name"] == "_matmul_body" and race["axes"] == [2], race


def test_a_dma_race_inside_one_program_is_stopped_by_the_tpu_semantics_run():
    # No grid (one program): nothing is revisited and Mosaic compiles it.
    report = check(
        DOUBLE_SPEC, FORGERIES / "target_dma_race.py", "compact", 3, targets=("tpu-v5e",)
    )
    tpu = report.targets["tpu-v5e"]
    assert right_in_program_order(report)
    assert not report.certified and not tpu.ok
    assert "race_detected" in kinds(tpu), tpu.findings


def test_a_lowering_the_child_claims_is_judged_on_the_bytes_it_filed(no_static_gate):
    # The child files its CPU interpret artifact as the chip's and says "ok".
    report = check(
        MATMUL_SPEC, FORGERIES / "target_forged_lowering.py", "compact", 3, targets=("tpu-v5e",)
    )
    tpu = report.targets["tpu-v5e"]
    assert all(c.passed for c in report.cases)
    assert not report.certified and not tpu.ok and tpu.failure_class == "compile_error"
    assert "not ['tpu']" in tpu.error, tpu.error


def test_a_forged_lowering_does_not_even_run_past_the_static_gate():
    report = check(
        MATMUL_SPEC, FORGERIES / "target_forged_lowering.py", "compact", 3, targets=("tpu-v5e",)
    )
    assert not report.certified and not report.cases  # never executed
    assert "forbidden_import" in {v.rule for v in report.integrity.violations}
    assert "not executed" in report.diagnosis


@pytest.mark.parametrize(
    ("forgery", "spec", "target"),
    [
        ("target_chip_switch_gpu.py", MATMUL_SPEC, "gpu"),
        ("target_chip_switch_tpu.py", MATMUL_SPEC, "tpu-v5e"),
        ("target_backend_switch.py", MATMUL_SPEC, "tpu-v5e"),
        ("target_semantics_downgrade.py", CUMSUM_SPEC, "tpu-v5p"),
        ("target_semantics_downgrade_dma.py", DOUBLE_SPEC, "tpu-v5e"),
        ("target_platform_dependent_tpu.py", MATMUL_SPEC, "tpu-v5e"),
        ("target_platform_dependent_gpu.py", MATMUL_SPEC, "gpu"),
    ],
)
def test_a_kernel_that_asks_where_it_is_traced_is_refused(forgery, spec, target):
    # These were certified while wrong on their target: each tells the engine's contexts apart
    # (the abstract mesh of a TPU lowering, the CPU backend, a second trace) and shows the
    # check one kernel and the chip another. The gate refuses the question itself; one trace
    # per shape (below) stops all but the backend switch even without the gate.
    report = check(spec, FORGERIES / forgery, "compact", 3, targets=(target,))
    assert not report.certified
    assert "config_tamper" in {v.rule for v in report.integrity.violations}


PLATFORM_DEPENDENT = [
    ("target_platform_dependent_tpu.py", "tpu-v5e"),
    ("target_platform_dependent_gpu.py", "gpu"),
]


@pytest.mark.parametrize(("forgery", "target"), PLATFORM_DEPENDENT)
def test_a_kernel_chosen_by_platform_at_lowering_is_refused_by_its_artifact(
    no_static_gate, forgery, target
):
    # Certified before: the CPU runs got one branch of lax.platform_dependent, the chip's
    # lowering (and the chip) the other. The artifact of a one-platform lowering keeps a
    # single-branch case: the executor refuses it, so no case passes.
    report = check(MATMUL_SPEC, FORGERIES / forgery, "compact", 3, targets=(target,))
    assert not report.certified
    assert report.cases and not any(c.passed for c in report.cases)
    assert all("chose by platform" in (c.error.message if c.error else "") for c in report.cases), [
        c.diagnosis for c in report.cases
    ]


def test_a_kernel_that_counts_its_traces_shows_every_artifact_the_same_kernel():
    # Asks JAX nothing, so the gate has nothing to refuse: its first trace is the misaligned
    # kernel, any later one the golden. One trace per shape gives the chip the first.
    report = check(
        MATMUL_SPEC, FORGERIES / "target_trace_counter.py", "compact", 3, targets=("tpu-v5e",)
    )
    tpu = report.targets["tpu-v5e"]
    assert right_in_program_order(report)
    assert not report.certified and not tpu.ok and tpu.failure_class == "compile_error"
    assert "(64, 64)" in tpu.error and "target_trace_counter.py" in tpu.error, tpu.error


@pytest.mark.parametrize(
    ("forgery", "spec", "target", "failure_class", "finding"),
    [
        ("target_chip_switch_gpu.py", MATMUL_SPEC, "gpu", "grid_race", "grid_race"),
        ("target_chip_switch_tpu.py", MATMUL_SPEC, "tpu-v5e", "compile_error", None),
        ("target_semantics_downgrade.py", CUMSUM_SPEC, "tpu-v5p", "grid_race", "order_dependent"),
        ("target_semantics_downgrade_dma.py", DOUBLE_SPEC, "tpu-v5e", "grid_race", "race_detected"),
    ],
)
def test_one_trace_per_shape_stops_context_switches_without_the_gate(
    no_static_gate, forgery, spec, target, failure_class, finding
):
    # The chip's lowering, the gpu verdict's grid and the TPU-semantics run all re-evaluate the
    # trace whose numbers were compared, with the execution mode set by the engine: a kernel
    # that switches on its context has only one context to see.
    report = check(spec, FORGERIES / forgery, "compact", 3, targets=(target,))
    result = report.targets[target]
    assert right_in_program_order(report)
    assert not report.certified and not result.ok and result.failure_class == failure_class
    assert finding is None or finding in kinds(result), result.findings


def test_an_aliased_buffer_read_one_block_ahead_is_a_gpu_race():
    # Every output block is written once, so the outputs' index maps say nothing; the read of
    # the aliased input at block i + 1, which program i + 1 writes, is the race.
    report = check(
        SHIFT_SPEC, FORGERIES / "target_alias_neighbour.py", "compact", 3, targets=("gpu",)
    )
    gpu = report.targets["gpu"]
    assert right_in_program_order(report)
    assert not report.certified and not gpu.ok and gpu.failure_class == "grid_race"
    race = next(f for f in gpu.findings if f["kind"] == "aliased_read_race")
    assert race["kernel_name"] == "_add_next_body" and race["points"] == [[0], [1]], race
    assert "input 0" in race["detail"] and "output 0" in race["detail"]


def test_an_in_place_update_reading_only_its_own_block_is_certified_for_gpu():
    report = check(SHIFT_SPEC, PLANTED / "alias_own_block.py", "compact", 3, targets=("gpu",))
    assert report.certified, (report.diagnosis, report.targets["gpu"])
    assert report.targets["gpu"].findings == [] and report.targets["gpu"].undetermined == []


def test_a_kernel_that_asks_to_be_interpreted_is_compiled_for_the_chip_all_the_same():
    report = check(
        MATMUL_SPEC, FORGERIES / "target_interpret_true.py", "compact", 3, targets=("tpu-v5e",)
    )
    tpu = report.targets["tpu-v5e"]
    assert right_in_program_order(report)
    assert not report.certified and not tpu.ok and tpu.failure_class == "compile_error"
    assert "(64, 64)" in tpu.error, tpu.error
    # Not a violation: a note that the engine set the mode.
    assert report.integrity.ok and any("interpret=" in n for n in report.integrity.notes)


def test_an_interpret_flag_passed_through_does_not_stop_a_kernel_certifying_for_a_chip():
    honest = OPS / "integrity" / "honest" / "interpret_passed_through.py"
    report = check(
        OPS / "softmax_rows" / "spec.py", honest, "compact", 3, targets=("interpret", "tpu-v5e")
    )
    assert report.certified, report.diagnosis
    assert report.targets["tpu-v5e"].ok and report.targets["tpu-v5e"].compile_s > 0
    assert report.integrity.notes == [
        "`interpret=` passed to `functools.partial` at interpret_passed_through.py:20: the "
        "engine sets the execution mode itself (interpret on CPU, the chip's compiler for a "
        "target)"
    ]


def test_state_carried_in_scratch_across_gpu_programs_is_not_certified_for_gpu():
    # The cumsum golden, unchanged: right on TPU, whose grid runs in order and keeps scratch;
    # GPU programs have their own scratch and run concurrently.
    report = check(
        CUMSUM_SPEC, FORGERIES / "target_gpu_scratch_carry.py", "compact", 3, targets=("gpu",)
    )
    gpu = report.targets["gpu"]
    assert right_in_program_order(report)
    assert not report.certified and not gpu.ok
    assert any("scratch" in reason for reason in gpu.undetermined), gpu


@pytest.mark.parametrize(
    ("forgery", "spec"),
    [("fill_nan_padding_mask.py", COL_SUM_SPEC), ("fill_nan_scratch_carry.py", CUMSUM_SPEC)],
)
def test_a_kernel_that_tells_unwritten_memory_by_its_nan_is_refused_for_the_chip(forgery, spec):
    # Right in both interpret modes, whose fresh memory and padding are always NaN; a TPU's
    # hold whatever was there, as the second TPU-semantics run's do.
    report = check(spec, FORGERIES / forgery, "all", 1, targets=("interpret", "tpu-v5e"))
    tpu = report.targets["tpu-v5e"]
    assert report.integrity.ok and all(c.passed for c in report.cases)  # right in emulation
    assert report.targets["interpret"].ok
    assert not report.certified and not tpu.ok, tpu
    assert "fill_dependent" in kinds(tpu), tpu.findings
    assert "values nobody wrote" in tpu.error


def test_a_float32_dot_right_only_in_float32_is_refused_for_the_chip_with_its_line():
    report = check(
        CUMSUM_SPEC,
        FORGERIES / "chip_default_precision_dot.py",
        "all",
        1,
        targets=("interpret", "tpu-v5e"),
    )
    tpu = report.targets["tpu-v5e"]
    assert report.integrity.ok and all(c.passed for c in report.cases)
    assert not report.certified and not tpu.ok and tpu.failure_class == "precision", tpu
    assert "chip_precision" in kinds(tpu), tpu.findings
    # The diagnosis names the dot, what the chip does with it, and the fix.
    assert (
        f"chip_default_precision_dot.py:{line_of('jnp.dot(', 'chip_default_precision_dot.py')}"
        in tpu.error
    )
    assert "one bfloat16 pass on tpu-v5e" in tpu.error and "Precision.HIGHEST" in tpu.error


def test_the_same_dot_at_highest_precision_is_certified_for_the_chip():
    # The cumsum golden asks for HIGHEST: the chip's six passes are float32's, and nothing of
    # its memory is read before it is written.
    report = check(
        CUMSUM_SPEC, OPS / "cumsum_rows" / "golden.py", "all", 1, targets=("interpret", "tpu-v5e")
    )
    assert report.certified, (report.diagnosis, report.targets["tpu-v5e"])


@pytest.mark.parametrize(
    ("forgery", "what"),
    [
        ("chip_shift_by_width.py", "a shift by 32 or more"),
        ("chip_float_to_int_overflow.py", "a float converted to int32 that it does not fit"),
    ],
)
def test_an_integer_operation_the_chip_leaves_undefined_is_refused_with_its_line(forgery, what):
    # XLA on a CPU gives each a fixed answer the kernel relies on; the TPU compiler's is poison.
    report = check(DOUBLE_SPEC, FORGERIES / forgery, "compact", 3, targets=("tpu-v5e",))
    tpu = report.targets["tpu-v5e"]
    assert right_in_program_order(report)
    assert not report.certified and not tpu.ok and tpu.failure_class == "runtime_error", tpu
    assert "undefined_on_chip" in kinds(tpu), tpu.findings
    assert what in tpu.error, tpu.error
    assert f"{forgery}:{line_of('scale = ', forgery)}" in tpu.error, tpu.error


# -- the gpu target on a CPU: Pallas' Triton lowering, TF32, and what a ragged block reads ------


def test_a_float32_dot_at_default_precision_is_refused_for_gpu_as_tf32_and_highest_certifies(
    tmp_path: Path,
):
    forgery = FORGERIES / "gpu_default_precision_dot.py"
    gpu = refused_on_gpu(MATMUL_SPEC, forgery, "compact", "precision")
    assert "TF32" in gpu.error and "HIGHEST" in gpu.error
    assert f"gpu_default_precision_dot.py:{line_of('o_ref[...] = jnp.dot(', forgery.name)}" in (
        gpu.error
    )
    # The same kernel asking for HIGHEST: right on a GPU and on a TPU, certified for both.
    fixed = tmp_path / "matmul_highest.py"
    fixed.write_text(
        forgery.read_text().replace("PRECISION = None", "PRECISION = jax.lax.Precision.HIGHEST")
    )
    report = check(MATMUL_SPEC, fixed, "compact", 1, targets=("interpret", "tpu-v5e", "gpu"))
    assert report.certified, report.diagnosis
    assert "Triton" in report.targets["gpu"].verified_by


def test_a_block_triton_cannot_hold_is_refused_for_gpu_with_its_shape_and_line():
    forgery = FORGERIES / "gpu_block_not_power_of_two.py"
    gpu = refused_on_gpu(MATMUL_SPEC, forgery, "compact", "compile_error")
    assert "block (96, 256): Triton needs power-of-two block shapes" in gpu.error
    assert f"gpu_block_not_power_of_two.py:{line_of('pl.pallas_call(', forgery.name)}" in (
        gpu.error
    )


def test_a_mosaic_gpu_kernel_is_lowered_by_mosaic_gpu_and_its_refusal_has_the_line(tmp_path):
    # Left unverified for gpu ("not lowered without a GPU") before the check ran that lowering.
    forgery = FORGERIES / "gpu_mosaic_narrow_block.py"
    gpu = refused_on_gpu(LEAKY_RELU_SPEC, forgery, "compact", "compile_error")
    assert "Mosaic GPU's lowering: Async copies require" in gpu.error, gpu.error
    assert f"gpu_mosaic_narrow_block.py:{line_of('pl.pallas_call(', forgery.name)}" in gpu.error
    # The same kernel with 128 columns a block: lowered, read back by the executor, certified.
    wide = tmp_path / "gpu_mosaic_wide_block.py"
    wide.write_text(forgery.read_text().replace("BLOCK_C = 32, 2", "BLOCK_C = 32, 128"))
    report = check(LEAKY_RELU_SPEC, wide, "all", 1, targets=("interpret", "gpu"))
    assert report.certified, report.diagnosis


def test_a_kernel_that_tells_a_ragged_blocks_tail_by_nan_is_refused_for_gpu():
    report = check(
        COL_SUM_SPEC,
        FORGERIES / "gpu_fill_nan_tail_rows.py",
        "all",
        1,
        targets=("interpret", "gpu"),
    )
    gpu = report.targets["gpu"]
    assert report.integrity.ok and all(c.passed for c in report.cases)  # right in emulation
    assert not report.certified and not gpu.ok, gpu
    assert "fill_dependent" in kinds(gpu), gpu.findings
    assert not any(f.get("kind") == "grid_race" for f in gpu.findings)  # no race: its reads


def test_the_softmax_golden_is_refused_for_gpu_on_its_ragged_block_through_triton():
    # Certified for gpu by grid semantics alone before the check lowered through Triton.
    report = check(
        OPS / "softmax_rows" / "spec.py",
        OPS / "softmax_rows" / "golden.py",
        "extended",
        1,
        targets=("interpret", "gpu"),
    )
    gpu = report.targets["gpu"]
    assert all(c.passed for c in report.cases) and not report.certified
    assert gpu.failure_class == "compile_error" and "block (8, 320)" in gpu.error, gpu


def test_a_ragged_output_block_stored_whole_is_refused_for_gpu_and_a_masked_store_certifies():
    forgery = FORGERIES / "gpu_ragged_store.py"
    gpu = refused_on_gpu(COL_SUM_SPEC, forgery, "all", "compile_error")
    assert "writes past the array's end" in gpu.error
    stored = "o_ref[...] = jnp.sum(x, axis=0, keepdims=True).astype(o_ref.dtype)"
    assert f"gpu_ragged_store.py:{line_of(stored, forgery.name)}" in gpu.error
    # The same kernel storing through a mask of the columns inside the array: right on a GPU.
    masked = PLANTED / "gpu_col_sum.py"
    report = check(COL_SUM_SPEC, masked, "all", 1, targets=("interpret", "gpu"))
    assert report.certified, report.diagnosis


def test_one_whole_array_block_is_judged_by_what_each_gpu_program_stores():
    # Triton-style: no output BlockSpec (every program's block is the whole array), each program
    # stores its own columns through a mask. BlockSpecs alone called it a race.
    planted = PLANTED / "gpu_col_sum_whole_block.py"
    report = check(COL_SUM_SPEC, planted, "all", 1, targets=("interpret", "gpu"))
    assert report.certified, report.diagnosis
    assert any("no element is stored by two programs" in n for n in report.targets["gpu"].notes)
    # The same kernel clearing its neighbour's columns too: right in every ordered run, a race
    # on a GPU, and the verdict names two programs and the element they both store.
    forgery = FORGERIES / "gpu_clears_next_tile.py"
    gpu = refused_on_gpu(COL_SUM_SPEC, forgery, "all", "grid_race")
    assert "programs 0 and 1 (of the flattened grid) both store its element [0, 128]" in gpu.error


def test_stores_from_a_branch_and_a_loop_are_judged_by_what_each_gpu_program_stores(tmp_path):
    # The same whole-array block, stored in halves from a fori_loop under pl.when: the
    # footprint followed only stores at the body's top and left this a block-level race.
    planted = PLANTED / "gpu_col_sum_store_in_loop.py"
    report = check(COL_SUM_SPEC, planted, "all", 1, targets=("interpret", "gpu"))
    assert report.certified, report.diagnosis
    # One more pass of the loop stores into the neighbour's first columns: right in every
    # ordered run, a race on a GPU, named by the two programs and the element.
    forgery = tmp_path / "gpu_col_sum_loop_into_next_tile.py"
    forgery.write_text(planted.read_text().replace("HALVES = 2 ", "HALVES = 3 "))
    gpu = refused_on_gpu(COL_SUM_SPEC, forgery, "all", "grid_race")
    assert "programs 0 and 1 (of the flattened grid) both store its element [0, 128]" in gpu.error


def test_gpu_modules_of_another_kernel_do_not_count_for_the_gpu_target():
    # The candidate's process swaps Triton's lowering for one of a decoy kernel: the modules it
    # files verify, so before the executor matched them to the artifact's kernels the gpu target
    # took them as this kernel's lowering and certified a block Triton refuses.
    forgery = FORGERIES / "gpu_decoy_triton_module.py"
    report = check(
        LEAKY_RELU_SPEC, forgery, "compact", 1, targets=("interpret", "gpu"), integrity="report"
    )
    gpu = report.targets["gpu"]
    assert all(c.passed for c in report.cases), report.diagnosis
    assert not gpu.ok and "not this program's lowering" in str(gpu), gpu
    assert "decoy" in str(gpu), gpu
    # The gate, enforcing, refuses the candidate outright (a private JAX module imported).
    enforced = check(LEAKY_RELU_SPEC, forgery, "compact", 1, targets=("interpret", "gpu"))
    assert not enforced.certified and not enforced.integrity.ok
