"""`spec check --tell-apart`: the input the spec allows on which one of two kernels is right and
the other is not, written as the case to add to the spec."""

from __future__ import annotations

import json

from conftest import OPS, ROOT
from nearmiss.cli.main import main
from nearmiss.engine.spec import Case

FORGERIES = ROOT / "tests" / "forgeries"
SOFTMAX = OPS / "softmax_rows"


def test_a_kernel_keyed_on_the_listed_sizes_is_told_from_the_golden_by_a_case_to_add(capsys):
    # Both pass every case the spec lists; the forgery's grid covers 64 rows and no more.
    argv = ["spec", "check", str(SOFTMAX / "spec.py"), "--json", "--tell-apart"]
    argv += [str(SOFTMAX / "golden.py"), str(FORGERIES / "hidden_fixed_grid.py")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    found = json.loads(out)
    assert found["passes"].endswith("golden.py") and found["fails"].endswith("fixed_grid.py")
    assert found["case"]["suite"] == "hidden" and not found["case"]["passed"]
    assert found["case"]["dims"]["R"] > 64, found["case"]
    assert "seed 1/4" in err  # progress on stderr, stdout only the JSON
    # The line is a Case the spec can hold as written, and it is the case that failed.
    case = eval(found["add_to_spec"], {"Case": Case})
    assert dict(case.dims) == found["case"]["dims"] and case.dtype == found["case"]["dtype"]
