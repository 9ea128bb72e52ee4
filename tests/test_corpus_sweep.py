"""The corpus sweep: every golden certifies (for TPU v5e too), every cheat is rejected with its
rule, no honest kernel is flagged. Every near-miss variant failing with its labelled class on its
labelled suite — on the target its label names, and right in interpret mode where that is another
target — is asserted by ``test_playbook.py::test_playbook_over_the_corpus``, on the same check it
repairs from (the corpus is not checked twice).

Each kernel is its own test so xdist spreads them; ``conftest.pytest_terminal_summary`` prints
the tallies and the accuracy.
"""

from __future__ import annotations

import os

import pytest

from nearmiss.engine.check import check
from pallas_ops.catalog import integrity_cases, operators

SEED = int(os.environ.get("NEARMISS_SWEEP_SEED", "0"))
OPERATORS = operators()
INTEGRITY = integrity_cases()


# Each operator's golden in its xdist group, with its variants' tests (``test_playbook``): one
# test process checks them one after another, on the spec's child the first check kept.
@pytest.mark.parametrize(
    "op", [pytest.param(op, id=op.name, marks=pytest.mark.xdist_group(op.name)) for op in OPERATORS]
)
def test_golden_certifies(op):
    # On the CPU interpret target and on TPU v5e: compiled by Mosaic (libtpu, compile-only),
    # its grid read for TPU semantics, its cases run again under TPU interpret mode.
    report = check(op.spec, op.golden, seed=SEED, targets=("interpret", "tpu-v5e"))
    assert report.certified, report.diagnosis
    assert report.integrity.ok and report.integrity.audited_cases == len(report.cases)
    assert report.targets["tpu-v5e"].ok and report.targets["tpu-v5e"].compile_s > 0


@pytest.mark.parametrize("case", INTEGRITY, ids=lambda c: f"{c.rule or 'honest'}/{c.path.stem}")
def test_integrity_case(case):
    report = check(case.spec, case.path, seed=SEED)
    rules = {v.rule for v in report.integrity.violations}
    if case.rule is None:
        assert report.certified and not rules, report.diagnosis
    else:
        assert not report.certified
        assert case.rule in rules, report.integrity.violations
