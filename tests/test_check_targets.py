"""`check --target`: a kernel is certified for a target only when the target accepts it.

Real JAX lowering, the real Mosaic compiler (libtpu, compile-only) and JAX's TPU interpret mode;
nothing is mocked. Each test looks at what the check concludes, per target, for kernels that are
right in CPU interpret mode and wrong (or right) where they are meant to run.
"""

from __future__ import annotations

import json

from conftest import MATMUL_SPEC, OPS, PLANTED, run_cli
from nearmiss.engine.check import check

MISALIGNED = PLANTED / "tpu_misaligned_block.py"
DOUBLE_SPEC = PLANTED / "tpu_spec" / "spec.py"


def test_a_golden_compiles_for_tpu_and_its_k_accumulation_races_on_gpu():
    report = check(
        MATMUL_SPEC, OPS / "matmul" / "golden.py", "compact", 1, targets=("tpu-v5e", "gpu")
    )
    tpu, gpu = report.targets["tpu-v5e"], report.targets["gpu"]
    assert all(c.passed for c in report.cases)  # right numbers in interpret mode...
    assert tpu.ok and tpu.compile_s > 0 and tpu.memory["argument_bytes"] > 0, tpu
    assert not gpu.ok and gpu.failure_class == "grid_race"  # ...but a race on a GPU
    assert gpu.findings[0]["kind"] == "grid_race" and gpu.findings[0]["axes"] == [2]
    assert "no GPU" in gpu.verified_by
    assert not report.certified and report.failure_class == "grid_race"


def test_a_misaligned_block_is_a_compile_error_naming_the_target_and_the_line():
    report = check(DOUBLE_SPEC, MISALIGNED, "compact", 1, targets=("interpret", "tpu-v5e"))
    assert report.targets["interpret"].ok and all(c.passed for c in report.cases)
    tpu = report.targets["tpu-v5e"]
    assert not tpu.ok and tpu.failure_class == "compile_error"
    assert "tpu_misaligned_block.py:" in tpu.error and "128" in tpu.error, tpu.error
    assert not report.certified and report.failure_classes == ["compile_error"]
    assert report.diagnosis.startswith("tpu-v5e: refuses the kernel")


def test_a_reduction_axis_declared_parallel_fails_tpu_semantics():
    report = check(MATMUL_SPEC, PLANTED / "matmul_parallel_k.py", "all", 3, targets=("tpu-v5p",))
    tpu = report.targets["tpu-v5p"]
    assert all(c.passed for c in report.cases)  # program order hides it
    kinds = {f["kind"] for f in tpu.findings}
    assert "parallel_revisit" in kinds, tpu.findings  # read from the artifact's grid
    assert "race_detected" in kinds, tpu.findings  # and seen by TPU interpret mode, 2 cores
    assert not report.certified and tpu.failure_class == "grid_race"


def test_the_specs_declared_target_applies_unless_the_command_line_names_others():
    declared = check(DOUBLE_SPEC, MISALIGNED, "compact", 1)
    assert list(declared.targets) == ["tpu-v5e"] and not declared.certified
    overridden = check(DOUBLE_SPEC, MISALIGNED, "compact", 1, targets=("interpret",))
    assert list(overridden.targets) == ["interpret"] and overridden.certified


def test_the_cli_reports_each_target_and_refuses_unknown_ones():
    done = run_cli(
        "check",
        MATMUL_SPEC,
        OPS / "matmul" / "golden.py",
        "--suite",
        "compact",
        "--target",
        "tpu-v5e,gpu",
        "--json",
    )
    assert done.returncode == 1, done.stderr
    targets = json.loads(done.stdout)["targets"]
    assert targets["tpu-v5e"]["ok"] and targets["gpu"]["failure_class"] == "grid_race"
    text = run_cli(
        "check",
        MATMUL_SPEC,
        OPS / "matmul" / "golden.py",
        "--suite",
        "compact",
        "--target",
        "tpu-v5e",
    )
    assert text.returncode == 0 and "target tpu-v5e: ok (compiled" in text.stdout, text.stdout
    bad = run_cli("check", MATMUL_SPEC, OPS / "matmul" / "golden.py", "--target", "tpu-v9")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "tpu-v9" in bad.stderr


def test_a_case_wrong_in_program_order_is_not_blamed_on_the_targets_order():
    # The floor-division grid leaves a ragged tail unwritten: wrong in every order, a boundary
    # bug, not a grid race on TPU.
    variant = OPS / "softmax_rows" / "variants" / "floor_grid.py"
    report = check(OPS / "softmax_rows" / "spec.py", variant, "all", 1, targets=("tpu-v5e",))
    assert report.targets["tpu-v5e"].ok, report.targets["tpu-v5e"]
    assert report.failure_class == "boundary" and not report.certified
