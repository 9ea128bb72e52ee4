"""Condense a ``CheckReport`` into the loop's ``Evidence``: score, signature, expectations."""

from __future__ import annotations

from nearmiss.engine.hidden import HIDDEN_SUITE, listed
from nearmiss.engine.models import CaseResult, CheckReport, ControlFinding, Evidence, Finding

# How far a failing case got, by its class: it did not build, it built and crashed, it ran and
# returned the wrong structure, it ran and returned numbers (wrong ones).
_STAGE = {"compile_error": 0, "runtime_error": 1, "timeout": 1, "shape_mismatch": 2}
_STAGES = 3


def _partial(case) -> float:
    """How close a failing case came, in [0, 1): half for how far it got, half for the share of
    its elements within tolerance (none unless it ran)."""
    stage = _STAGE.get(case.failure_class or "", _STAGES)  # numbers, a grid race: it ran
    closeness = 0.0
    if case.leaves:
        total = sum(leaf.total for leaf in case.leaves) or 1
        closeness = max(0.0, 1.0 - sum(leaf.mismatched for leaf in case.leaves) / total)
    return min(0.5 * stage / _STAGES + 0.5 * closeness, 0.999)


def score(report: CheckReport) -> float:
    """Candidates ranked by how far they get: certified 1.0; else by the cases that pass, then
    — among candidates passing as many — by how far the failing ones got (a kernel that runs
    and is wrong outranks one that does not build) and how many of their elements are right.
    An integrity violation scores 0. Lexicographic by construction: ``(passed + partial) /
    (cases + 1)`` with ``partial < 1``, so one more passing case always wins."""
    if report.certified:
        return 1.0
    if not report.integrity.ok:
        return 0.0
    # The listed cases only: the hidden ones are drawn anew by every check, and a score that
    # moved with them would read a new draw as progress or regression.
    return score_cases(listed(report.cases))


def score_cases(cases: list[CaseResult]) -> float:
    """``score`` of an uncertified run's cases alone (always below 1)."""
    if not cases:
        return 0.0
    failing = [c for c in cases if not c.passed]
    passed = len(cases) - len(failing)
    partial = sum(_partial(c) for c in failing) / len(failing) if failing else 0.0
    # Below 1 by construction: an uncertified candidate never ties a certified one.
    return 0.99 * (passed + partial) / (len(cases) + 1)


def signature(report: CheckReport) -> str:
    """The same failure, for the loop's guards: the primary class, the listed cases that fail
    and how, the rules. Failing hidden cases count as one mark, "hidden": each check draws its
    own, and a signature that moved with the draw would read it as progress or a new failure."""
    failing = sorted(
        f"{c.suite}/{c.name}:{c.failure_class}" for c in listed(report.cases) if not c.passed
    )
    hidden_failing = any(not c.passed for c in report.cases if c.suite == HIDDEN_SUITE)
    # The primary class is a hidden case's only where nothing listed and no target failed.
    hidden_only = hidden_failing and not failing and all(t.ok for t in report.targets.values())
    head = "hidden" if hidden_only else (report.failure_class or "none")
    marks = [*failing, "hidden"] if hidden_failing else failing
    rules = sorted({v.rule for v in report.integrity.violations})
    return "|".join([head, ",".join(marks), ",".join(rules)])


def evidence_from_report(report: CheckReport, candidate_hash: str, report_hash: str) -> Evidence:
    first_failing = next((c for c in report.cases if not c.passed), None)
    # The output structure the spec wants, where the candidate got it wrong (e.g. a dtype).
    structure = first_failing.structure if first_failing and first_failing.structure else None
    return Evidence(
        candidate_hash=candidate_hash,
        suite=report.suite,
        certified=report.certified,
        failure_class=report.failure_class,
        failure_classes=list(report.failure_classes),
        integrity_ok=report.integrity.ok,
        violations=[Finding(rule=v.rule, detail=v.detail) for v in report.integrity.violations],
        diagnosis=report.diagnosis,
        compact_passed=report.compact_passed,
        extended_passed=report.extended_passed,
        cases_passed=sum(c.passed for c in listed(report.cases)),
        cases_total=len(listed(report.cases)),
        score=score(report),
        signature=signature(report),
        report_hash=report_hash,
        op=report.op,
        category=report.category,
        platform=report.platform,
        structure_problem=structure,
        targets={name: result.ok for name, result in report.targets.items()},
        controls=controls(report),
        triggers={f"{c.suite}/{c.name}": c.trigger for c in report.cases if c.trigger},
        speedup=report.speedup,
        slowest_case=report.slowest_case,
    )


def controls(report: CheckReport) -> list[ControlFinding]:
    """The failing cases' control experiments, each with the case it controls."""
    return [
        ControlFinding(
            case=f"{case.suite}/{case.name}",
            name=control.name,
            dims=control.dims,
            dtype=control.dtype,
            profile=control.profile,
            passed=control.passed,
            max_abs_error=control.max_abs_error,
            source=control.source,
        )
        for case in report.cases
        for control in case.controls
    ]
