"""The corpus sweep: every golden certifies, every near-miss variant fails with its labelled
class on its labelled suite, every cheat is rejected with its rule, no honest kernel is flagged.

Each kernel is its own test so xdist spreads them; ``conftest.pytest_terminal_summary`` prints
the tallies and the accuracy.
"""

from __future__ import annotations

import os

import pytest

from nearmiss.check import check
from pallas_ops.catalog import integrity_cases, operators
from pallas_ops.verify import first_failing_suite

SEED = int(os.environ.get("NEARMISS_SWEEP_SEED", "0"))
OPERATORS = operators()
VARIANTS = [(op, v) for op in OPERATORS for v in op.variants]
INTEGRITY = integrity_cases()


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_golden_certifies(op):
    report = check(op.spec, op.golden, seed=SEED)
    assert report.certified, report.diagnosis
    assert report.integrity.ok and report.integrity.audited_cases == len(report.cases)


@pytest.mark.parametrize(
    ("op", "variant"), VARIANTS, ids=[f"{op.name}/{v.path.stem}" for op, v in VARIANTS]
)
def test_variant_fails_with_its_label(op, variant):
    report = check(op.spec, variant.path, seed=SEED)
    assert not report.certified
    got = (report.failure_class, first_failing_suite(report))
    assert got == (variant.failure_class, variant.fails_on), report.diagnosis
    assert report.integrity.ok, report.integrity.violations  # a bug, not a cheat


@pytest.mark.parametrize("case", INTEGRITY, ids=lambda c: f"{c.rule or 'honest'}/{c.path.stem}")
def test_integrity_case(case):
    report = check(case.spec, case.path, seed=SEED)
    rules = {v.rule for v in report.integrity.violations}
    if case.rule is None:
        assert report.certified and not rules, report.diagnosis
    else:
        assert not report.certified
        assert case.rule in rules, report.integrity.violations
