"""Pydantic models of what the engine reports; shared by the CLI, activities and workflows.

These are the `nearmiss check --json` contract (DESIGN.md): ``certified``, ``failure_class``,
``failure_classes``, ``integrity`` {``ok``, ``violations``} and ``cases`` are required keys.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

FailureClass = Literal[
    "compile_error",
    "runtime_error",
    "timeout",
    "shape_mismatch",
    "grid_race",
    "nan_inf",
    "boundary",
    "unstable",
    "precision",
    "wrong_values",
]

# The suite a case belongs to ("custom": the engine's control cases; "hidden": cases the engine
# drew for a certifying check, nearmiss.engine.hidden), and the suites a check runs.
CaseSuite = Literal["compact", "extended", "custom", "hidden"]
CheckSuite = Literal["compact", "extended", "all"]

# Order used to pick the primary class of a run: the most fundamental failure first, since an
# agent must fix a kernel that does not compile before one that is merely imprecise.
FAILURE_CLASSES = frozenset(get_args(FailureClass))
FAILURE_PRIORITY: tuple[FailureClass, ...] = (
    "compile_error",
    "runtime_error",
    "timeout",
    "shape_mismatch",
    "grid_race",
    "wrong_values",
    "nan_inf",
    "boundary",
    "unstable",
    "precision",
)

Phase = Literal["import", "trace", "compile", "run", "sandbox"]


class ErrorInfo(BaseModel):
    """A failure to build or run the candidate, cut down to what points at the bug."""

    phase: Phase
    type: str
    message: str
    location: str | None = None  # "kernel.py:23" — the candidate's own line when known
    source_line: str | None = None
    excerpt: list[str] = Field(default_factory=list)  # the few relevant traceback lines


class LeafStats(BaseModel):
    """Comparison of one output array (pytree leaf) with the reference's."""

    path: str
    shape: list[int]
    dtype: str
    total: int
    mismatched: int
    mismatched_fraction: float
    max_abs_error: float
    max_rel_error: float
    rms_rel_error: float  # rms(out - ref) / rms(ref) over finite elements
    nan_count: int  # NaN in the output where the reference is finite
    inf_count: int  # Inf in the output where the reference is finite
    ref_max_abs: float
    worst_index: list[int] | None = None
    scale_fit: float | None = None  # c in out ≈ c·ref when that explains the error
    offset_fit: float | None = None  # b in out ≈ ref + b when that explains the error
    # [min, max] of c_r in out ≈ c_r·ref row by row (last axis), when the factor differs by row
    # and that explains the error: each row's own normalisation is wrong.
    row_scale_range: list[float] | None = None
    # max |out - ref| / (atol + rtol·|ref|) over finite elements: how close the leaf came to
    # failing (1 = on the edge, above 1 = fails). None where an element differs although its
    # tolerance is 0 (exact comparison), or in reports saved before the figure existed.
    tolerance_used: float | None = None


class AxisProfile(BaseModel):
    """Which indices along one output axis hold mismatches."""

    axis: int
    size: int
    bad_count: int
    bad_ranges: str  # "40-44, 63" — compact, readable


class TileProfile(BaseModel):
    """Mismatches per kernel output block (from the pallas_call's BlockSpec)."""

    block_shape: list[int]
    grid_shape: list[int]  # tiles per axis covering the output
    tiles_total: int
    tiles_bad: int
    bad_tiles: list[list[int]]  # the first few bad tile coordinates
    partial_tiles_bad: int  # bad tiles that are partial (ragged edge)
    only_partial_tiles: bool


class MismatchMap(BaseModel):
    """A picture of where an output mismatches, small enough to keep in every report.

    The output is seen as 2-D: its leading axes are collapsed into rows (rows = prod(shape[:-1]),
    cols = shape[-1]; a 1-D output is one row). Each cell covers ``cell_rows`` × ``cell_cols``
    elements (at most 64 × 64 cells; edge cells may hold fewer) and holds the mismatched share of
    them scaled to 0..255: 0 exactly when none mismatches, at least 1 when any does.
    """

    rows: int
    cols: int
    cell_rows: int
    cell_cols: int
    cells: list[list[int]]
    # The output block of the kernel in this view (from its BlockSpec), when known: tile_cols =
    # block[-1], tile_rows = block[-2] (1 for a 1-D output). With leading axes collapsed, tiles
    # restart every ``slab_rows`` rows (= shape[-2]), so tile edges in rows lie at
    # k·tile_rows within each slab plus every slab boundary.
    tile_rows: int | None = None
    tile_cols: int | None = None
    slab_rows: int = 1
    collapsed_axes: int = 0  # leading axes folded into rows (ndim - 2, or 0)


class Localisation(BaseModel):
    """Where on an output the errors sit."""

    leaf: str
    axes: list[AxisProfile]
    tiles: TileProfile | None = None
    tail_only: bool = False  # every mismatch lies in a ragged tail along some axis
    tail_axes: list[int] = Field(default_factory=list)
    suspected_axis: int | None = None
    spread: bool = False  # mismatches scattered like noise rather than structured
    heatmap: MismatchMap | None = None  # None for a 0-D output
    # The input value that sets failing rows apart from passing ones (forensics.triggers).
    trigger: str | None = None
    # The input positions, along an axis the output reduces away, that the error follows
    # (forensics.attribution).
    follows: str | None = None
    # Which outputs one nudged input element moves in the kernel against the reference
    # (forensics.reach): asked only when nothing above gave a lead.
    reach: str | None = None


class ControlResult(BaseModel):
    """A control experiment on a failing case (``forensics.controls``): the case with one thing
    changed — its dims aligned to the kernel's blocks, the normal value profile, float32 — to
    isolate what triggers the failure. Evidence only: a control never certifies anything."""

    name: str  # "ragged.aligned", "offset.normal", "bf16.float32", "ragged.aligned-C"
    varies: Literal["dims", "profile", "dtype"]
    dims: dict[str, int]
    dtype: str
    profile: str
    passed: bool | None = None  # None: the spec could not serve it (``note`` says why)
    failure_class: FailureClass | None = None
    max_abs_error: float | None = None  # the worst leaf's, where the outputs were compared
    mismatched_fraction: float | None = None
    # "run": ran in this check; "suite": the suite has exactly this case (``note`` names it);
    # "cache": an earlier check of the same candidate and spec ran it.
    source: Literal["run", "suite", "cache"] = "run"
    note: str = ""


class CaseResult(BaseModel):
    """The verdict and evidence for one case."""

    # "custom": a case an experiment asked for (nearmiss.engine.tools), never part of a certificate.
    suite: CaseSuite
    name: str
    dims: dict[str, int]
    dtype: str
    profile: str
    passed: bool
    failure_class: FailureClass | None = None
    error: ErrorInfo | None = None
    structure: str | None = None  # what differs in shape/dtype/pytree, when it does
    leaves: list[LeafStats] = Field(default_factory=list)
    localisation: Localisation | None = None
    kernel_grid: list[int] | None = None
    diagnosis: str = ""
    atol: float = 0.0
    rtol: float = 0.0
    # The largest of its leaves' ``tolerance_used``: a passing case near 1 may flake with a
    # fresh seed. None when the outputs were not compared (crash, wrong structure), when an
    # element differs where the tolerance allows no difference, or in older saved reports.
    tolerance_used: float | None = None
    compile_s: float | None = None
    run_s: float | None = None
    # The median of warm runs (``runner.timing``) of the kernel and of the reference compiled
    # by XLA on the same device, and reference_s / kernel_s. Times are recorded when asked for;
    # the speedup only on a device (``CheckReport.times``), never between emulated times.
    kernel_s: float | None = None
    reference_s: float | None = None
    speedup: float | None = None
    profile_error: str = ""  # why a time asked for is missing
    # A failing numeric case's control experiments, and the sentence they support (``trigger``:
    # "fails iff C is not a multiple of 128 (aligned C=256 passes); ..."); empty otherwise.
    controls: list[ControlResult] = Field(default_factory=list)
    trigger: str | None = None


class Violation(BaseModel):
    rule: str
    detail: str


class IntegrityReport(BaseModel):
    ok: bool = True
    mode: str = "enforce"  # enforce | report | off
    violations: list[Violation] = Field(default_factory=list)
    rules_checked: list[str] = Field(default_factory=list)
    # Cases whose run was audited; 0 means the dynamic rules had nothing to judge (the kernel
    # never ran, or the gate was off), so ``ok`` rests on the static rules alone.
    audited_cases: int = 0
    # What the gate noticed and the engine took care of, never a reason to refuse: e.g. an
    # ``interpret=`` the engine overrode.
    notes: list[str] = Field(default_factory=list)


class TargetResult(BaseModel):
    """Whether one target accepts the kernel (``nearmiss.engine.targets``), and on what evidence."""

    ok: bool
    verified_by: str  # what stands behind ``ok``, in words
    failure_class: FailureClass | None = None
    error: str | None = None  # trimmed, with the candidate's line where the compiler gave one
    compile_s: float | None = None  # the target compiler's seconds, all cases together
    memory: dict[str, int] = Field(default_factory=dict)  # the largest case's figures
    findings: list[dict[str, Any]] = Field(default_factory=list)  # grid semantics
    undetermined: list[str] = Field(default_factory=list)  # what could not be verified
    notes: list[str] = Field(default_factory=list)  # judged and let through (an unused output)


class CheckReport(BaseModel):
    """Everything `nearmiss check` concludes about a candidate."""

    op: str
    category: str
    spec: str
    candidate: str
    suite: CheckSuite
    seed: int
    platform: str
    jax_version: str
    isolation: str = "process"  # "namespaces": private PID/mount/network namespaces per child
    # The numbers' verdict: every case right and every target accepting the kernel.
    passed: bool = False
    # ``passed`` with the integrity gate enforcing and finding nothing; never true under
    # ``--integrity report`` or ``off``.
    certified: bool
    failure_class: FailureClass | None = None
    failure_classes: list[FailureClass] = Field(default_factory=list)
    integrity: IntegrityReport = Field(default_factory=IntegrityReport)
    cases: list[CaseResult] = Field(default_factory=list)
    diagnosis: str = ""
    compact_passed: bool | None = None
    extended_passed: bool | None = None
    wall_s: float = 0.0
    # What the cases' ``compile_s``/``run_s`` measure: "emulated" where the kernels ran in CPU
    # interpret mode (the Python interpreter's speed, nothing of the kernel's on a chip: never
    # compared with a reference's time), "device" where they ran on an accelerator.
    times: Literal["emulated", "device"] = "emulated"
    targets: dict[str, TargetResult] = Field(default_factory=dict)
    # What the verdict could not cover: hidden cases the spec could not serve, a spec too
    # narrow to draw them from (nearmiss.engine.hidden); and each dim's domain they draw from.
    notes: list[str] = Field(default_factory=list)
    domains: dict[str, str] = Field(default_factory=dict)
    # On a device: the geometric mean of the cases' speedups over the XLA reference, and the
    # case where the kernel gains least (``nearmiss.engine.runner.timing``); else None.
    speedup: float | None = None
    slowest_case: str | None = None


# What the loop, the fixers and the knowledge base see of a check: the report condensed
# (activities.evidence builds it). Here, below every layer that reads it.
class Finding(BaseModel):
    rule: str
    detail: str


class ControlFinding(BaseModel):
    """A control experiment on a failing case (``nearmiss.engine.forensics.controls``): the case
    with one thing changed — aligned dims, the normal profile, float32 — and whether it passes."""

    case: str  # the failing case it controls, "extended/ragged"
    name: str
    dims: dict[str, int]
    dtype: str
    profile: str
    passed: bool | None = None  # None: the spec could not serve it
    max_abs_error: float | None = None
    source: str = "run"  # run in this check, a suite case, or cached from an earlier check


class Evidence(BaseModel):
    """What one check of one candidate showed, condensed for the loop and the fixers."""

    candidate_hash: str
    suite: str
    certified: bool
    failure_class: str | None = None
    failure_classes: list[str] = Field(default_factory=list)
    integrity_ok: bool = True
    violations: list[Finding] = Field(default_factory=list)
    diagnosis: str = ""
    compact_passed: bool | None = None
    extended_passed: bool | None = None
    cases_passed: int = 0
    cases_total: int = 0
    # Progress measure in [0, 1]: 0 for integrity violations or nothing running, growing with
    # the passing cases and shrinking mismatches; 1 only when certified.
    score: float = 0.0
    # Failure class × which cases fail × integrity rules: "the same failure" for no-progress.
    signature: str = ""
    report_hash: str = ""  # the full CheckReport JSON in the blob store
    op: str = ""
    category: str = ""
    platform: str = ""
    # How the first failing case's output structure differs, e.g. "out is float32[64,256], the
    # reference's is bfloat16[64,256]"; None when the structure is right.
    structure_problem: str | None = None
    # The targets the check judged (nearmiss.engine.targets), each with whether it accepted the
    # kernel.
    targets: dict[str, bool] = Field(default_factory=dict)
    # Where the check ran: the worker's identity, its task queue, the targets it serves, its
    # device (workflows.routing). Empty for checks from before target queues.
    worker: dict[str, str] = Field(default_factory=dict)
    # The failing cases' control experiments, and per case what they isolate ("extended/ragged":
    # "fails iff C is not a multiple of 128 (aligned C=256 passes); ...").
    controls: list[ControlFinding] = Field(default_factory=list)
    triggers: dict[str, str] = Field(default_factory=dict)
    # On a device: the kernel's speed over the XLA reference's (CheckReport.speedup), so a fix
    # that makes it right does not make it slower unseen; None in emulation.
    speedup: float | None = None
    slowest_case: str | None = None
    # A certify check of a candidate with changes it did not need (``activities.trim``): the
    # candidate proposed, and each change put back as the original had it. This evidence is the
    # trimmed candidate's.
    trimmed_from: str = ""
    trimmed: list[str] = Field(default_factory=list)
