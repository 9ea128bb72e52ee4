"""The loop's ranking of candidates (``activities.evidence.score``): how far each gets."""

from __future__ import annotations

from activities.evidence import score
from nearmiss.engine.models import CaseResult, CheckReport, IntegrityReport, LeafStats, Violation


def _leaf(mismatched: int, total: int = 100) -> LeafStats:
    return LeafStats(
        path="out",
        shape=[total],
        dtype="float32",
        total=total,
        mismatched=mismatched,
        mismatched_fraction=mismatched / total,
        max_abs_error=1.0,
        max_rel_error=1.0,
        rms_rel_error=1.0,
        nan_count=0,
        inf_count=0,
        ref_max_abs=1.0,
    )


def _case(name: str, failure: str | None = None, mismatched: int | None = None) -> CaseResult:
    return CaseResult(
        suite="compact",
        name=name,
        dims={"N": 100},
        dtype="float32",
        profile="normal",
        passed=failure is None,
        failure_class=failure,
        atol=1e-5,
        rtol=1e-5,
        leaves=[] if mismatched is None else [_leaf(mismatched)],
    )


def _report(*cases: CaseResult, certified: bool = False, ok: bool = True) -> CheckReport:
    integrity = IntegrityReport(
        ok=ok, violations=[] if ok else [Violation(rule="wrapper_compute", detail="x")]
    )
    return CheckReport(
        op="t",
        category="elementwise",
        spec="s.py",
        candidate="k.py",
        suite="all",
        seed=1,
        platform="cpu",
        jax_version="0",
        certified=certified,
        cases=list(cases),
        integrity=integrity,
    )


def test_a_kernel_that_runs_and_is_wrong_outranks_one_that_does_not_build():
    # Every element wrong still outranks a compile error: the old score tied them at 0, so a
    # learned patch that broke the build was kept.
    wrong = _report(_case("a", "wrong_values", mismatched=100), _case("b", "wrong_values", 100))
    crashed = _report(_case("a", "runtime_error"), _case("b", "runtime_error"))
    broken = _report(_case("a", "compile_error"), _case("b", "compile_error"))
    shape = _report(_case("a", "shape_mismatch"), _case("b", "shape_mismatch"))
    assert score(wrong) > score(shape) > score(crashed) > score(broken) >= 0.0


def test_one_more_passing_case_always_wins_and_certified_is_best():
    nearly = _report(_case("a"), _case("b", "wrong_values", mismatched=1), _case("c", "nan_inf", 1))
    more = _report(_case("a"), _case("b"), _case("c", "compile_error"))
    assert score(more) > score(nearly)
    assert score(_report(_case("a"), _case("b"), _case("c"), certified=True)) == 1.0
    assert score(_report(_case("a"), _case("b"), _case("c"))) < 1.0  # right numbers, refused
    # Among equals, more elements within tolerance rank higher.
    closer = _report(_case("a"), _case("b", "wrong_values", 10), _case("c", "wrong_values", 10))
    farther = _report(_case("a"), _case("b", "wrong_values", 90), _case("c", "wrong_values", 90))
    assert score(closer) > score(farther)


def test_an_integrity_violation_scores_nothing():
    assert score(_report(_case("a"), _case("b"), ok=False)) == 0.0
