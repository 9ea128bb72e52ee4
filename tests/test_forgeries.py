"""Forgeries: candidates that attack the verdict itself, with the static gate switched off.

The static gate would refuse most of these on sight; here it is disabled so the test shows what
holds without it. The candidate's Python only traces: the outputs and the audit come from its
exported artifact, run and audited by a child that never imports the candidate.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import MATMUL_SPEC, OPS, SOFTMAX_SPEC
from nearmiss.engine import check as check_module
from nearmiss.engine.check import check

FORGERIES = Path(__file__).resolve().parent / "forgeries"


@pytest.fixture
def no_static_gate(monkeypatch):
    monkeypatch.setattr(check_module, "static_violations", lambda source, name: [])


@pytest.mark.parametrize(
    ("candidate", "rule"),
    [
        ("forged_audit.py", "no_pallas_call"),  # rewrote the audit in its own process
        ("forged_label.py", "no_pallas_call"),  # named plain XLA like a kernel
    ],
)
def test_a_forgery_is_judged_on_its_artifact(no_static_gate, candidate, rule):
    report = check(SOFTMAX_SPEC, FORGERIES / candidate, "compact", 5)
    assert report.cases and all(c.passed for c in report.cases)  # the numbers are right...
    assert not report.certified  # ...and still no certificate
    assert rule in {v.rule for v in report.integrity.violations}


def test_a_forged_answer_on_the_channel_is_no_result(no_static_gate):
    report = check(SOFTMAX_SPEC, FORGERIES / "forged_message.py", "compact", 5)
    assert not report.certified
    assert [c.failure_class for c in report.cases] == ["runtime_error"]
    assert "unusable result" in report.cases[0].diagnosis


@pytest.mark.parametrize(
    ("spec", "candidate"),
    [
        (MATMUL_SPEC, "forged_label_loop.py"),  # XLA named like a kernel, a loop at its top
        (MATMUL_SPEC, "unbounded_small_steps.py"),  # a data-bound loop of scalar work
        (OPS / "embedding_gather" / "spec.py", "gather_in_a_loop.py"),  # slices at data positions
    ],
)
def test_work_done_outside_the_kernel_is_found_however_it_is_dressed(
    no_static_gate, spec, candidate
):
    report = check(spec, FORGERIES / candidate, "compact", 5)
    assert report.cases and all(c.passed for c in report.cases)  # the numbers are right...
    assert not report.certified  # ...and still no certificate
    assert "wrapper_compute" in {v.rule for v in report.integrity.violations}
