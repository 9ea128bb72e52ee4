"""Condense a ``CheckReport`` into the loop's ``Evidence``: score, signature, expectations."""

from __future__ import annotations

from nearmiss.models import CheckReport
from workflows.models import Evidence, Finding


def _case_score(case) -> float:
    """1 for a passing case; for a failing one, the share of elements within tolerance."""
    if case.passed:
        return 1.0
    if not case.leaves:
        return 0.0  # did not compile, crashed, wrong structure
    total = sum(leaf.total for leaf in case.leaves) or 1
    mismatched = sum(leaf.mismatched for leaf in case.leaves)
    return max(0.0, 1.0 - mismatched / total)


def score(report: CheckReport) -> float:
    if report.certified:
        return 1.0
    if not report.integrity.ok or not report.cases:
        return 0.0
    passed = sum(c.passed for c in report.cases) / len(report.cases)
    closeness = sum(_case_score(c) for c in report.cases) / len(report.cases)
    # Below 1 by construction: an uncertified candidate never ties a certified one.
    return 0.99 * (0.5 * passed + 0.5 * closeness)


def signature(report: CheckReport) -> str:
    failing = sorted(f"{c.suite}/{c.name}:{c.failure_class}" for c in report.cases if not c.passed)
    rules = sorted({v.rule for v in report.integrity.violations})
    return "|".join([report.failure_class or "none", ",".join(failing), ",".join(rules)])


def evidence_from_report(report: CheckReport, candidate_hash: str, report_hash: str) -> Evidence:
    first_failing = next((c for c in report.cases if not c.passed), None)
    # The output structure the spec wants, where the candidate got it wrong (e.g. a dtype).
    structure = first_failing.structure if first_failing and first_failing.structure else None
    return Evidence(
        candidate_hash=candidate_hash,
        suite=report.suite,
        certified=report.certified,
        failure_class=report.failure_class,
        failure_classes=report.failure_classes,
        integrity_ok=report.integrity.ok,
        violations=[Finding(rule=v.rule, detail=v.detail) for v in report.integrity.violations],
        diagnosis=report.diagnosis,
        compact_passed=report.compact_passed,
        extended_passed=report.extended_passed,
        cases_passed=sum(c.passed for c in report.cases),
        cases_total=len(report.cases),
        score=score(report),
        signature=signature(report),
        report_hash=report_hash,
        op=report.op,
        category=report.category,
        platform=report.platform,
        structure_problem=structure,
        targets={name: result.ok for name, result in report.targets.items()},
    )
