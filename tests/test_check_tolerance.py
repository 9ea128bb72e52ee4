"""How much of its tolerance each case used: in the JSON per case and leaf, and as one line of a
passing check's human output, so a tolerance too tight for its dtype shows before it flakes."""

from __future__ import annotations

from conftest import OPS, SOFTMAX_SPEC
from nearmiss.engine.check import check
from nearmiss.engine.models import CaseResult, CheckReport
from nearmiss.reports.text import render_report, tolerance_line


def _case(name: str, used: float | None, passed: bool = True) -> CaseResult:
    return CaseResult(
        suite="compact",
        name=name,
        dims={"N": 8},
        dtype="float32",
        profile="normal",
        passed=passed,
        atol=1e-5,
        rtol=1e-5,
        tolerance_used=used,
    )


def _report(*cases: CaseResult) -> CheckReport:
    return CheckReport(
        op="t",
        category="elementwise",
        spec="ops/t/spec.py",
        candidate="kernel.py",
        suite="all",
        seed=1,
        platform="cpu",
        jax_version="0",
        certified=all(c.passed for c in cases),
        cases=list(cases),
    )


def test_a_golden_reports_the_share_of_tolerance_per_case_and_leaf():
    report = check(SOFTMAX_SPEC, OPS / "softmax_rows" / "golden.py", "compact", 1)
    assert report.certified
    for case in report.model_dump(mode="json")["cases"]:
        leaves = [leaf["tolerance_used"] for leaf in case["leaves"]]
        assert 0 <= case["tolerance_used"] <= 1
        assert case["tolerance_used"] == max(leaves)
    assert "tolerance: " in render_report(report)


def test_the_line_names_the_case_closest_to_its_tolerance():
    line = tolerance_line(_report(_case("base", 0.1), _case("big_rows", 0.625)))
    assert line is not None
    head, warning = line.split("\n")
    assert head == "tolerance: at most 63% used (case big_rows, float32 atol=1e-05 rtol=1e-05)"
    assert "may fail (flake) with a fresh seed" in warning
    assert "`nearmiss spec check ops/t/spec.py`" in warning


def test_half_or_less_is_said_without_a_warning():
    assert tolerance_line(_report(_case("base", 0.5))) == (
        "tolerance: at most 50% used (case base, float32 atol=1e-05 rtol=1e-05)"
    )
    assert tolerance_line(_report(_case("base", 0.003))).startswith("tolerance: under 1% used")
    assert tolerance_line(_report(_case("base", 0.0))) == (
        "tolerance: none used (every case matched the reference exactly)"
    )


def test_no_line_when_a_case_failed_or_the_report_predates_the_figure():
    assert tolerance_line(_report(_case("base", 0.2), _case("ragged", 3.0, passed=False))) is None
    assert "tolerance:" not in render_report(_report(_case("base", 0.9, passed=False)))
    # A report saved before the figure existed loads (the field defaults) and says nothing.
    saved = _case("base", None).model_dump()
    del saved["tolerance_used"]
    assert CaseResult.model_validate(saved).tolerance_used is None
    assert tolerance_line(_report(CaseResult.model_validate(saved))) is None
