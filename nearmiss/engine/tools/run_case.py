"""``run_case``: the candidate on one suite case, or on a custom case the spec allows.

The evidence is `nearmiss check`'s for that case — the same children, comparison, localisation
and classification (``check.case_result``) — so an experiment and a check never disagree about
what a failure is. With the session's seed a named case gets the inputs the check drew.
"""

from __future__ import annotations

from pathlib import Path

from nearmiss.engine.check import case_result
from nearmiss.engine.models import CaseResult, LeafStats
from nearmiss.engine.runner.session import Limits
from nearmiss.engine.tools.experiment import CaseRequest, Refused, case_ref, refusal, run_candidate
from nearmiss.engine.tools.models import RunCaseResult
from nearmiss.engine.tools.text import (
    capped,
    case_line,
    clip,
    error_lines,
    finish,
    grid_line,
    number,
)

MAX_LEAVES = 4


def leaf_line(leaf: LeafStats) -> str:
    worst = f", worst at {leaf.worst_index}" if leaf.worst_index else ""
    return clip(
        f"{leaf.path} {leaf.dtype}{leaf.shape}: {leaf.mismatched}/{leaf.total} mismatched "
        f"({leaf.mismatched_fraction:.1%}), max abs err {number(leaf.max_abs_error)}, "
        f"NaN {leaf.nan_count}, Inf {leaf.inf_count}{worst}"
    )


def case_grid_line(result: CaseResult) -> str | None:
    """The case's grid line (``text.grid_line``): the kernel's grid, and the output tiles of the
    localised output where the case failed with one."""
    loc = result.localisation
    tiles = loc.tiles if loc is not None else None
    return grid_line(
        result.kernel_grid,
        tiles.block_shape if tiles else None,
        tiles.grid_shape if tiles else None,
    )


def verdict_lines(result: CaseResult) -> list[str]:
    """The case's verdict and evidence in a few lines."""
    timing = ""
    if result.compile_s is not None:
        timing = f" (compile {result.compile_s:.2g} s, run {result.run_s or 0:.2g} s)"
    lines = [("PASS" if result.passed else f"FAIL {result.failure_class}") + timing]
    if result.error is not None and result.error.phase != "sandbox":
        return lines + error_lines(result.error)
    if result.structure:
        lines.append(clip(f"structure: {result.structure}"))
    leaves = [leaf_line(leaf) for leaf in result.leaves]
    lines += capped(leaves, MAX_LEAVES)
    grid = case_grid_line(result)
    if grid:
        lines.append(grid)
    if not result.passed and result.diagnosis:
        lines.append("diagnosis: " + clip(result.diagnosis, 900))
    return lines


def run_case(
    spec_path: str | Path,
    candidate_path: str | Path,
    *,
    case: str | None = None,
    dims: dict[str, int] | None = None,
    dtype: str | None = None,
    profile: str | None = None,
    seed: int = 0,
    limits: Limits | None = None,
) -> RunCaseResult:
    """Run the candidate on one case: a named suite case (default: the first compact one),
    varied by ``dims``/``dtype``/``profile`` into a custom case where given."""
    try:
        request = CaseRequest(case, dims, dtype, profile)
        _, _, raw = run_candidate(spec_path, candidate_path, request, seed, limits)
    except Refused as exc:
        return refusal(RunCaseResult, str(exc), seed=seed)
    result = case_result(raw, Path(candidate_path).name)
    if result.localisation is not None:
        result.localisation.heatmap = None  # 4096 numbers: error_map's business, not this one's
    outcome = RunCaseResult(case=case_ref(raw), seed=seed, result=result)
    assert outcome.case is not None  # set just above
    outcome.summary = finish([case_line(outcome.case), *verdict_lines(result)])
    return outcome
