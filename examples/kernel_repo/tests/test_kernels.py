"""This repository's kernels, certified by nearmiss in its own pytest run (the `nearmiss`
fixture comes with the package; paths are read from the repository's root)."""

import pytest


def test_scale_shift_is_certified(nearmiss):
    nearmiss.assert_certified("specs/scale_shift_spec.py", "kernels/scale_shift.py")


@pytest.mark.nearmiss(suite="compact")
def test_scale_shift_on_its_compact_suite(nearmiss):
    report = nearmiss.check("specs/scale_shift_spec.py", "kernels/scale_shift.py")
    assert report.certified and {c.suite for c in report.cases} == {"compact"}
