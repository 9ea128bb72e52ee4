"""`tell_apart`: the input the spec allows on which one of two kernels is right and the other
is not, written as the case to add to the spec."""

from __future__ import annotations

from conftest import OPS, ROOT
from nearmiss.engine.spec import Case
from nearmiss.engine.tell_apart import tell_apart

FORGERIES = ROOT / "tests" / "forgeries"
SOFTMAX = OPS / "softmax_rows"


def test_a_kernel_keyed_on_the_listed_sizes_is_told_from_the_golden_by_a_case_to_add():
    # Both pass every case the spec lists; the forgery's grid covers 64 rows and no more.
    found = tell_apart(
        SOFTMAX / "spec.py", SOFTMAX / "golden.py", FORGERIES / "hidden_fixed_grid.py"
    )
    assert found is not None
    assert found.passes.endswith("golden.py") and found.fails.endswith("hidden_fixed_grid.py")
    assert found.case.suite == "hidden" and not found.case.passed
    assert found.case.dims["R"] > 64, found.case
    line = found.case_line()
    case = eval(line, {"Case": Case})  # the line is a Case the spec can hold as written
    assert dict(case.dims) == found.case.dims and case.dtype == found.case.dtype
    assert "hidden_fixed_grid.py fails" in found.describe()
