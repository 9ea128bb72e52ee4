"""Nudges (``forensics.reach``): when one case's numbers give no lead, the engine moves one input
element and compares which outputs move in the kernel and in the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_playbook_holdout6 import HOLDOUT6
from test_playbook_shipped import SPECS, planted

from nearmiss.check import check
from nearmiss.forensics import reach
from nearmiss.models import CaseResult, Localisation

NUDGE = reach.Nudge("base.nudge-x", ("compact", "base"), "x", 0, (1, 4))


def footprint(shape, *cells) -> np.ndarray:
    mask = np.zeros(shape, bool)
    for cell in cells:
        mask[cell] = True
    return mask


def test_a_footprint_cut_to_its_own_element_names_the_missing_reduction():
    row = footprint((2, 8), (1, slice(None)))
    text = reach.describe(NUDGE, footprint((2, 8), (1, 4)), row, "out")
    assert text.startswith("Nudging x[1, 4] moves 8 elements of out in the reference ([1, 0-7])")
    assert "and 1 in the kernel ([1, 4])" in text
    assert "carries x[1, 4] along output axis 1 and the kernel does not" in text


def test_an_ignored_element_and_a_misdirected_one_are_told_apart():
    row = footprint((2, 8), (1, slice(None)))
    assert "the kernel ignores x[1, 4]" in reach.describe(NUDGE, np.zeros((2, 8), bool), row)
    both_rows = footprint((2, 8), (slice(None), slice(None)))
    assert "to outputs the reference leaves alone" in reach.describe(NUDGE, both_rows, row)
    other_row = footprint((2, 8), (0, slice(None)))
    assert "to other outputs than the reference does" in reach.describe(NUDGE, other_row, row)
    assert reach.describe(NUDGE, row, row.copy()) is None  # the same footprint: no lead


def test_only_a_wrong_values_case_without_a_lead_is_nudged_and_only_its_float_inputs():
    def case(name, **loc) -> CaseResult:
        return CaseResult(
            suite="compact",
            name=name,
            dims={},
            dtype="float32",
            profile="normal",
            passed=False,
            failure_class="wrong_values",
            localisation=Localisation(leaf="out", axes=[], **loc),
        )

    x, lengths = np.zeros((4, 6), np.float32), np.zeros(4, np.int32)
    inputs = [("x", x), ("lengths", lengths), ("w", np.zeros(6, np.float32))]
    planned = reach.plan([case("base")], [inputs])
    assert [(n.input, n.position, n.index) for n in planned] == [("x", 0, (2, 3)), ("w", 2, (3,))]
    assert planned[0].request(case("base"))["nudge"] == {
        "of": ["compact", "base"],
        "input": 0,
        "index": [2, 3],
    }
    assert reach.plan([case("base", follows="The error follows ...")], [inputs]) == []


def test_an_unreduced_sum_of_squares_is_named_by_a_nudge_in_a_real_check(tmp_path: Path):
    """JAX's GPU rms norm with its lane accumulator never summed (holdout6): every element
    normalised by its own magnitude. The numbers alone said only "values are wrong"; the nudge
    runs the kernel once more and names the axis the reduction left out."""
    case = HOLDOUT6["rms_norm_sum_of_squares_unreduced"]
    candidate = tmp_path / "kernel.py"
    candidate.write_text(planted(case))
    report = check(SPECS / f"{case.spec}_spec.py", candidate, "compact", seed=3)
    failing = report.cases[0]
    assert report.failure_class == "wrong_values" and not report.certified
    said = failing.localisation.reach
    assert said and said.startswith("Nudging x[1, 4, 128] moves 256 elements of out in the ref")
    assert "and 1 in the kernel ([1, 4, 128])" in said
    assert "along output axis 2 and the kernel does not" in said
    assert said in failing.diagnosis and said in report.diagnosis
    # Evidence only: the nudges are not suite cases and certify nothing.
    assert [c.name for c in report.cases] == ["base"]
