"""Kernel profiling (issue 17): the median of warm runs of the kernel and of the reference
compiled by XLA, compared only when both ran on a device.

No device is lent here, so the device comparison is tested on reports and pure functions, and
the measuring itself through a real check on the CPU with the runs asked for: the times flow
from the two sandboxed children into the report, marked emulated and never compared."""

from __future__ import annotations

import json

import numpy as np
import pytest

from activities.evidence import evidence_from_report
from activities.fixers.openai_fixer import render_evidence
from conftest import OPS, SOFTMAX_SPEC
from nearmiss.engine.check import check, overall_speedup
from nearmiss.engine.models import CaseResult, CheckReport
from nearmiss.engine.runner.timing import (
    MAX_PROFILE_RUNS,
    PROFILE_RUNS,
    profile_runs_for,
    speedup,
    warm_median_s,
)
from nearmiss.reports.text import render_report


def test_the_warm_median_leaves_the_first_call_out_and_takes_the_middle_run():
    calls = []
    # Clock readings in pairs (start, end) per timed run: durations 5, 1, 3.
    readings = iter([0.0, 5.0, 10.0, 11.0, 20.0, 23.0])
    median = warm_median_s(lambda: calls.append(1) or np.zeros(2), 3, clock=lambda: next(readings))
    assert median == 3.0
    assert len(calls) == 4  # the warm-up, untimed, then three timed runs
    with pytest.raises(ValueError):
        warm_median_s(lambda: 0, 0)


def test_runs_default_to_some_on_a_device_and_none_in_emulation():
    assert profile_runs_for("cpu", None) == 0
    assert profile_runs_for("gpu", None) == PROFILE_RUNS
    assert profile_runs_for("cpu", 3) == 3
    assert profile_runs_for("gpu", 10**6) == MAX_PROFILE_RUNS
    assert profile_runs_for("gpu", -4) == 0


def test_a_speedup_is_only_computed_between_device_times():
    assert speedup(0.001, 0.003, "device") == pytest.approx(3.0)
    assert speedup(0.001, 0.003, "emulated") is None
    assert speedup(None, 0.003, "device") is None
    assert speedup(0.0, 0.003, "device") is None


def _case(name: str, kernel_s: float | None, reference_s: float | None, error: str = ""):
    return CaseResult(
        suite="compact",
        name=name,
        dims={"N": 8},
        dtype="float32",
        profile="normal",
        passed=True,
        kernel_s=kernel_s,
        reference_s=reference_s,
        speedup=speedup(kernel_s, reference_s, "device"),
        profile_error=error,
    )


def test_a_device_report_shows_each_case_and_the_geometric_mean():
    cases = [
        _case("small", 0.002, 0.001),  # half the reference's speed
        _case("large", 0.001, 0.008),  # eight times
        _case("odd", None, 0.001, "RuntimeError: out of memory"),
    ]
    summary = overall_speedup(cases)
    assert summary == {"speedup": pytest.approx(2.0), "slowest_case": "compact/small"}
    report = CheckReport(
        op="t",
        category="elementwise",
        spec="spec.py",
        candidate="kernel.py",
        suite="all",
        seed=1,
        platform="gpu",
        jax_version="0",
        certified=True,
        cases=cases,
        times="device",
        **summary,
    )
    text = render_report(report)
    assert "compact/small: kernel 2.000 ms, reference 1.000 ms (0.50x)" in text
    assert "compact/large: kernel 1.000 ms, reference 8.000 ms (8.00x)" in text
    assert "compact/odd: not compared (RuntimeError: out of memory)" in text
    assert "speedup 2.00x (geometric mean); least in compact/small" in text
    assert overall_speedup([_case("none", None, None)]) == {}
    # The fix step hears of it: a fix that makes the kernel right should not make it slower.
    shown = render_evidence(evidence_from_report(report, "c" * 64, "r" * 64))
    assert "Speed on the device: 2.00x the XLA reference's" in shown
    assert "least in compact/small" in shown
    emulated = report.model_copy(update={"times": "emulated", "speedup": None})
    assert "Speed on the device" not in render_evidence(evidence_from_report(emulated, "c", "r"))


def test_a_check_asked_for_runs_on_the_cpu_records_emulated_times_and_compares_none():
    golden = OPS / "softmax_rows" / "golden.py"
    report = check(SOFTMAX_SPEC, golden, "compact", 1, profile_runs=2)
    assert report.certified and report.times == "emulated" and report.cases
    for case in report.cases:
        # Both sides measured, each in its own sandboxed child...
        assert case.kernel_s is not None and case.kernel_s > 0, case
        assert case.reference_s is not None and case.reference_s > 0, case
        assert case.profile_error == ""
        assert case.speedup is None  # ...and never compared in emulation
    assert report.speedup is None and report.slowest_case is None
    assert "times emulated (CPU interpret mode), never compared" in render_report(report)
    saved = json.loads(report.model_dump_json())
    assert all(c["kernel_s"] > 0 and c["speedup"] is None for c in saved["cases"])

    default = check(SOFTMAX_SPEC, golden, "compact", 1)  # emulation times nothing by default
    assert all(c.kernel_s is None and c.reference_s is None for c in default.cases)
    assert "profile:" not in render_report(default)
