"""Control experiments (issue 16): a failing check runs the small variations of its failing cases
that isolate the trigger — the normal profile at the same dims, the nearest aligned dims, float32
for a bfloat16 case — names the trigger in the diagnosis and the evidence, and classifies by it.

The kernels and specs are written for these tests (``tests/controls/``): each fails only under
one trigger, and each puts its failing case at dims no suite case shares, so the control runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.evidence import evidence_from_report
from nearmiss.engine.check import check
from nearmiss.engine.forensics.controls import (
    CACHE,
    MAX_CONTROLS,
    ControlCache,
    ControlPlan,
    alignment,
)
from nearmiss.engine.models import CaseResult
from nearmiss.reports.text import render_report

HERE = Path(__file__).resolve().parent / "controls"
STANDARDISE = HERE / "standardise_spec.py"
UNMASKED = HERE / "unmasked_variance.py"


def failing(report) -> CaseResult:
    return next(c for c in report.cases if not c.passed)


def listed(report) -> list[CaseResult]:
    """The spec's own cases (a certifying check adds hidden ones)."""
    return [c for c in report.cases if c.suite != "hidden"]


def by_kind(case: CaseResult) -> dict[str, object]:
    return {c.name.split(".", 1)[1]: c for c in case.controls}


@pytest.fixture(scope="module")
def ragged_report():
    CACHE.clear()
    return check(STANDARDISE, UNMASKED, "all", seed=3)


def test_a_ragged_only_failure_is_boundary_whatever_the_profile(ragged_report):
    # Only the offset case is ragged: by the cases alone it read `unstable` ("passes on normal
    # inputs"). The controls run the normal profile at its own dims (fails: profile irrelevant)
    # and the offset profile at the aligned width (passes: the width is the trigger).
    report = ragged_report
    assert not report.certified and report.failure_class == "boundary", report.diagnosis
    case = failing(report)
    assert case.name == "offset" and case.failure_class == "boundary"
    controls = by_kind(case)
    aligned, normal = controls["aligned"], controls["normal"]
    assert aligned.dims == {"R": 16, "C": 256} and aligned.profile == "offset"
    assert aligned.passed is True and aligned.source == "run"
    assert normal.dims == {"R": 16, "C": 200} and normal.profile == "normal"
    assert normal.passed is False and normal.max_abs_error > 0
    assert "fails iff C is not a multiple of 128 (aligned C=256 passes)" in case.trigger
    assert "value profile irrelevant" in case.trigger
    assert f"Controls: {case.trigger}." in case.diagnosis
    assert "fails iff C is not a multiple of 128" in report.diagnosis
    # Controls never certify: the verdict and the counts are the suite's own cases.
    assert len(listed(report)) == 2 and report.compact_passed and not report.extended_passed


def test_the_report_lists_the_controls_and_they_can_be_skipped(ragged_report):
    text = render_report(ragged_report)
    assert "controls (extended/offset): fails iff C is not a multiple of 128" in text
    assert "offset.aligned: R=16 C=256 float32 offset: pass" in text
    # Without them, the cases alone misread it (issue 16): only the ragged case has the offset
    # profile and the normal case passes, so it looked `unstable`.
    bare = check(STANDARDISE, UNMASKED, "all", seed=3, controls=False)
    assert bare.failure_class == "unstable" and not failing(bare).controls


def test_controls_travel_in_the_evidence(ragged_report):
    evidence = evidence_from_report(ragged_report, "sha256:c", "sha256:r")
    assert {c.case for c in evidence.controls} == {"extended/offset"}
    found = {c.name: c for c in evidence.controls}
    assert found["offset.aligned"].passed is True
    assert found["offset.aligned"].dims == {"R": 16, "C": 256}
    assert found["offset.normal"].passed is False
    assert "fails iff C is not a multiple of 128" in evidence.triggers["extended/offset"]
    assert evidence.failure_class == "boundary"
    # The event log records them with the evidence.
    from workflows.loop import evidence_collected

    payload = evidence_collected(evidence, "forensics").payload()
    assert payload["controls"] and payload["triggers"] == evidence.triggers


def test_a_second_check_of_the_same_candidate_does_not_rerun_the_controls(ragged_report):
    again = check(STANDARDISE, UNMASKED, "all", seed=4)
    case = failing(again)
    assert case.controls and all(c.source == "cache" for c in case.controls)
    assert case.failure_class == "boundary" and case.trigger == failing(ragged_report).trigger


def test_a_failure_only_on_large_values_is_unstable_by_its_control():
    report = check(HERE / "softmax_spec.py", HERE / "no_max_softmax.py", "all", seed=3)
    case = failing(report)
    assert case.name == "large" and case.failure_class == "unstable", report.diagnosis
    assert report.failure_class == "unstable"
    (normal,) = case.controls
    assert normal.varies == "profile" and normal.profile == "normal"
    assert normal.dims == {"R": 8, "C": 256} and normal.passed is True and normal.source == "run"
    assert "the 'large' value profile triggers it" in case.trigger
    assert "'large' value profile" in case.diagnosis


def test_a_bfloat16_only_failure_names_the_dtype():
    report = check(HERE / "rowsum_spec.py", HERE / "narrow_accumulator.py", "all", seed=3)
    case = failing(report)
    assert case.name == "bf16" and case.dtype == "bfloat16", report.diagnosis
    (f32,) = case.controls
    assert f32.varies == "dtype" and f32.dtype == "float32" and f32.dims == {"R": 8, "C": 512}
    assert f32.passed is True and f32.max_abs_error < 1e-3
    assert "fails only in bfloat16 (float32 at the same dims passes)" in case.trigger
    assert case.failure_class == "precision"


def test_a_control_the_spec_cannot_serve_is_recorded_not_raised(tmp_path):
    spec = tmp_path / "picky_spec.py"
    source = STANDARDISE.read_text()
    spec.write_text(
        source.replace(
            "    x = jax.random.normal(key,",
            '    if case.profile == "offset" and case.dims["C"] % 128 == 0:\n'
            '        raise ValueError("offset rows need a ragged width")\n'
            "    x = jax.random.normal(key,",
        )
    )
    report = check(spec, UNMASKED, "all", seed=3)
    case = failing(report)
    controls = by_kind(case)
    assert controls["aligned"].passed is None
    assert "offset rows need a ragged width" in controls["aligned"].note
    assert "could not run" in case.trigger
    # The normal profile at the same dims still fails: not unstable, whatever other dims do.
    assert controls["normal"].passed is False
    assert case.failure_class not in ("unstable", "boundary"), case.diagnosis


def test_a_spec_child_that_dies_on_a_control_costs_the_controls_not_the_check(tmp_path):
    spec = tmp_path / "fragile_spec.py"
    spec.write_text(
        STANDARDISE.read_text().replace(
            "    x = jax.random.normal(key,",
            '    if case.dims["C"] == 200 and case.profile == "normal":\n'
            "        import os\n\n        os._exit(3)\n"
            "    x = jax.random.normal(key,",
        )
    )
    report = check(spec, UNMASKED, "all", seed=3)
    case = failing(report)
    assert case.name == "offset" and len(listed(report)) == 2
    assert all(c.passed is None for c in case.controls), case.controls
    assert "could not run" in case.trigger


# --- planning, without a sandbox ---------------------------------------------------------


def geometry(array, block):
    return [{"grid": [1], "outputs": [{"array_shape": array, "block_shape": block}]}]


def test_alignment_follows_the_output_blocks_and_falls_back_to_the_tile():
    # A dim the size of an output axis takes that axis's block; others the tile (8 or 128).
    assert alignment({"R": 45, "C": 384}, geometry([45, 384], [8, 384])) == {"R": (45, 48, 8)}
    # A block the whole width says nothing of the kernel's own loop over it: the tile does.
    assert alignment({"R": 45, "C": 320}, geometry([45, 320], [8, 320])) == {
        "R": (45, 48, 8),
        "C": (320, 384, 128),
    }
    assert alignment({"R": 45, "C": 200}, geometry([45, 256], [8, 256])) == {
        "R": (45, 48, 8),
        "C": (200, 256, 128),
    }
    assert alignment({"B": 3, "N": 64}, []) == {}  # small counts and whole tiles stay put
    assert alignment({"N": 100}, geometry([100], [32])) == {"N": (100, 128, 32)}


def case(name, dims, passed=False, klass="wrong_values", profile="normal", dtype="float32"):
    return CaseResult(
        suite="extended",
        name=name,
        dims=dims,
        dtype=dtype,
        profile=profile,
        passed=passed,
        failure_class=None if passed else klass,
    )


def test_the_plan_reuses_suite_cases_and_runs_at_most_four():
    cases = [
        case("base", {"R": 64, "C": 256}, passed=True),
        case("large", {"R": 64, "C": 256}, profile="large"),  # its control is `base`
        case("ragged_bf16", {"R": 45, "C": 200}, dtype="bfloat16", profile="offset"),
        case("crash", {"R": 45, "C": 200}, klass="runtime_error"),  # crashes get none
    ]
    plan = ControlPlan("kernel", "spec", ControlCache())
    first = plan.plan(cases, [[], [], [], []])
    assert [w["name"] for w in first] == [
        "ragged_bf16.normal",
        "ragged_bf16.aligned",
        "ragged_bf16.float32",
    ]
    assert first[1]["dims"] == {"R": 48, "C": 256} and first[1]["profile"] == "offset"
    # Aligning both dims made it pass: the second round aligns each alone, within the budget.
    passed = case("ragged_bf16.aligned", {"R": 48, "C": 256}, passed=True)
    second = plan.split({"ragged_bf16.aligned": passed})
    assert [w["name"] for w in second] == ["ragged_bf16.aligned-R"]
    assert second[0]["dims"] == {"R": 48, "C": 200}
    assert len(first) + len(second) == MAX_CONTROLS and plan.split({}) == []
    ran = {w["name"]: "not run" for w in first + second} | {"ragged_bf16.aligned": passed}
    plan.conclude(cases, ran)
    (reused,) = cases[1].controls
    assert reused.source == "suite" and reused.passed and reused.name == "base"
    assert cases[1].failure_class == "unstable"
    assert cases[2].failure_class == "boundary" and "aligned R=48, C=256 passes" in cases[2].trigger
    assert cases[3].controls == []


def test_a_failure_only_across_grid_steps_is_named_by_the_one_block_control():
    """An input index map that always reads column block 0 (a corpus near-miss): with one
    output block along C the kernel is right, so the control names the trigger — more than one
    grid step — and the axis (C), where the numbers alone only said 'values are wrong'."""
    ops = Path(__file__).resolve().parent.parent / "pallas_ops" / "col_sum"
    variant = ops / "variants" / "index_map_drops_column.py"
    report = check(ops / "spec.py", variant, "compact", seed=3)
    case = failing(report)
    one = by_kind(case)["one_block"]
    assert one.varies == "dims" and one.dims == {"R": 128, "C": 128} and one.passed is True
    assert "more than one step (one block, C=128, passes)" in case.trigger
    assert case.failure_class == "wrong_values"  # a cross-step bug is no boundary bug


def test_one_block_shrinks_only_the_dims_an_output_block_tiles():
    from nearmiss.engine.forensics.controls import one_block

    geometry = [{"outputs": [{"array_shape": [64, 512], "block_shape": [64, 128]}]}]
    assert one_block({"R": 64, "C": 512, "K": 300}, geometry) == {"C": (512, 128, 128)}
    assert one_block({"R": 64, "C": 128}, geometry) == {}  # already one block
