"""Results of the fix agent's tools: structured for events and reports, each with its summary.

Every result says whether the tool could do what was asked (``ok``; when not, ``error`` says
why — a bad argument, a refused probe, an unusable spec) and carries ``summary``, the compact
text the model reads. A failing *candidate* is evidence in an ok result, never ``ok=False``.
Lists are capped where they are built, so a result stays small whatever the kernel does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from nearmiss.engine.models import (
    AxisProfile,
    CaseResult,
    CaseSuite,
    ErrorInfo,
    MismatchMap,
    Violation,
)


class ToolResult(BaseModel):
    """What a tool call returns to the agent loop: ``summary`` for the model, ``data`` for
    events and reports (the tool's own result model, as JSON)."""

    tool: str
    ok: bool
    summary: str
    data: dict[str, Any] = Field(default_factory=dict)


class CaseRef(BaseModel):
    """The case an experiment ran on, with its inputs as the spec names them."""

    suite: CaseSuite
    name: str
    dims: dict[str, int]
    dtype: str
    profile: str
    inputs: list[str] = Field(default_factory=list)  # "x: float32[45, 320]"
    atol: float = 0.0
    rtol: float = 0.0


class Outcome(BaseModel):
    """Fields every tool result shares."""

    ok: bool = True
    error: str | None = None  # why the tool could not do what was asked
    case: CaseRef | None = None
    seed: int = 0
    summary: str = ""


class RunCaseResult(Outcome):
    """One case's verdict and evidence, as `nearmiss check` reports it (minus the heatmap:
    ``error_map`` is the tool for where errors sit)."""

    result: CaseResult | None = None


class TileCount(BaseModel):
    tile: list[int]  # tile coordinates along each output axis
    bad: int
    total: int  # elements of the tile inside the output (fewer in a partial edge tile)


class TileMap(BaseModel):
    """Mismatches per kernel output tile (from the candidate's BlockSpec) or, when its blocks
    are unknown, per cell of an even split of the output seen as 2-D."""

    unit: Literal["tile", "cell"]
    block_shape: list[int]  # elements per tile / cell along each axis of the counted array
    grid_shape: list[int]  # tiles / cells per axis
    total: int
    bad: int
    bad_ranges: list[str]  # per axis of the grid: "5" or "0-3, 7"
    listed: list[TileCount]  # the first bad ones, in index order
    more: int = 0  # bad ones not listed
    cell_tiles: list[int] = Field(default_factory=lambda: [1, 1])  # tiles per character
    picture: list[str] = Field(default_factory=list)  # '#' ≥ half bad, '+' some, '.' none


class ErrorMapResult(Outcome):
    passed: bool | None = None
    failure_class: str | None = None
    run_error: ErrorInfo | None = None  # the case failed before giving outputs to map
    structure: str | None = None  # outputs of the wrong shape / dtype / structure
    leaf: str | None = None  # the output mapped: the one with the most mismatches
    dtype: str | None = None
    shape: list[int] = Field(default_factory=list)
    mismatched: int = 0
    total: int = 0
    axes: list[AxisProfile] = Field(default_factory=list)
    tiles: TileMap | None = None
    tail_axes: list[int] = Field(default_factory=list)
    heatmap: MismatchMap | None = None


class ValueStats(BaseModel):
    """One array a probe returned (or a reference expression gave), summarised."""

    name: str
    shape: list[int]
    dtype: str
    min: float | None = None  # over finite elements; None when there are none
    max: float | None = None
    mean: float | None = None
    nan_count: int = 0
    inf_count: int = 0


class Comparison(BaseModel):
    """A probe value against the agent's reference expression for it."""

    name: str
    expression: str
    reference: ValueStats | None = None
    note: str | None = None  # why no comparison: the expression failed, shapes differ...
    differing: int = 0
    total: int = 0
    max_abs_diff: float | None = None
    first_index: list[int] | None = None  # first differing element in row-major order
    worst_index: list[int] | None = None  # NaN/Inf first, else the largest difference
    atol: float = 0.0
    rtol: float = 0.0


class ProbeResult(Outcome):
    """What an instrumented run showed; a probe never certifies anything."""

    refused: list[Violation] = Field(default_factory=list)
    probe_error: ErrorInfo | None = None
    values: list[ValueStats] = Field(default_factory=list)
    comparisons: list[Comparison] = Field(default_factory=list)
    more_values: int = 0


class LowerResult(Outcome):
    platform: Literal["tpu", "gpu"] = "tpu"
    target: str = ""  # JAX's name for it: tpu, cuda
    status: Literal["ok", "failed", "unavailable", "not_run"] = "not_run"
    lowering_error: ErrorInfo | None = None
    detail: str = ""
    jax_version: str = ""
