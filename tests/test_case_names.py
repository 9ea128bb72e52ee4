"""Tools take a case by its name or as evidence names it (``extended/ragged``); a name the spec
does not have is a one-line error listing the names it does."""

from __future__ import annotations

from conftest import OPS
from nearmiss.engine.tools import run_tool

SOFTMAX = OPS / "softmax_rows"


def _run(tool: str, case: str):
    return run_tool(
        tool,
        {"case": case},
        spec_path=SOFTMAX / "spec.py",
        candidate_path=SOFTMAX / "variants" / "floor_grid.py",
    )


def test_a_case_in_the_wrong_suite_is_a_one_line_error_listing_the_cases():
    for case in ("compact/ragged", "nope"):
        result = _run("error_map", case)
        assert not result.ok
        assert "\n" not in result.summary
        assert result.summary.endswith(
            f"unknown case {case!r}; cases: base (compact), ragged (extended), large (extended)"
        )
