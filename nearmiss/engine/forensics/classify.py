"""Failure classes (DESIGN.md's vocabulary) and the readable diagnosis of each case and run.

Per case: an exception or dead child decides the class outright; otherwise the numbers do —
ragged tail → ``boundary``; NaN/Inf where the reference is finite → ``nan_inf``; small errors
spread like rounding noise → ``precision``; anything else → ``wrong_values``. Across cases, a
numeric failure confined to adversarial value profiles while normal inputs pass is ``unstable``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from nearmiss.engine.models import (
    FAILURE_PRIORITY,
    CaseResult,
    ErrorInfo,
    FailureClass,
    LeafStats,
    Localisation,
)
from nearmiss.engine.runner.arrays import float_eps, restore_dtype

# Reduced precision (bfloat16/float16 intermediates) leaves errors of this size relative to the
# output's scale; a bug in the algorithm leaves larger or structured ones.
PRECISION_RMS_MAX = 0.05
PRECISION_PEAK_MAX = 0.25
# ... and at most this many of the narrowest type's epsilon (rounding errors of a long sum
# grow, and partly cancel): float16 (eps 2^-10) rounding cannot leave a 4 % rms error.
PRECISION_EPS_MULTIPLE = 8
# Errors within this many of the output type's own epsilon are its rounding: no kernel can
# promise less, so a failure that small is the tolerance's, not the kernel's.
ROUNDING_ULPS = 4
NUMERIC_CLASSES = ("nan_inf", "wrong_values", "precision")
COMPILE_PHASES = ("import", "trace", "compile")
# How a diagnosis starts when the outputs are the reference times a wrong factor (per row, or
# one for all): a fixer that reads the evidence looks for these words.
ROW_FACTOR_LEAD = "Outputs are the reference times a factor that differs by row"
CONSTANT_FACTOR_LEAD = "Outputs are a constant factor"


def error_class(error: ErrorInfo) -> FailureClass:
    """An exception is a compile_error before the kernel runs, a runtime_error once it does —
    except running out of memory, which is a runtime failure in whatever phase it strikes."""
    out_of_memory = error.type == "MemoryError" or "RESOURCE_EXHAUSTED" in error.message
    if error.phase in COMPILE_PHASES and not out_of_memory:
        return "compile_error"
    return "runtime_error"


def classify_numeric(
    stats: LeafStats, loc: Localisation, narrow_floats: list[str] | None = None
) -> FailureClass:
    """``narrow_floats``: the float types under 32 bits the kernel computes in (None: unknown).
    Small spread errors from a kernel with none are not rounding in a narrower type."""
    if loc.tail_only:
        return "boundary"
    if stats.nan_count or stats.inf_count:
        return "nan_inf"
    if is_precision_like(stats, loc, narrow_floats) and narrow_floats != []:
        return "precision"
    return "wrong_values"


def _epsilon(dtype_name: str) -> float | None:
    """The spacing of 1.0 in a float type named as the engine reports it; None otherwise."""
    try:
        return float_eps(restore_dtype(dtype_name))
    except (TypeError, ValueError):
        return None


def precision_rms_bound(narrow_floats: list[str] | None) -> float:
    """The largest rms relative error rounding can explain, given the float types under 32
    bits the kernel computes in (None or none known: the bfloat16-sized default)."""
    epsilons = [e for e in map(_epsilon, narrow_floats or ()) if e is not None]
    if not epsilons:
        return PRECISION_RMS_MAX
    return min(PRECISION_RMS_MAX, PRECISION_EPS_MULTIPLE * max(epsilons))


def at_output_rounding(stats: LeafStats) -> bool:
    """Errors no larger than a few ulps of the output's own type, relative to the reference."""
    eps = _epsilon(stats.dtype)
    return eps is not None and 0 < stats.max_rel_error <= ROUNDING_ULPS * eps


def computes_wide_only(stats: LeafStats, loc: Localisation, narrow_floats: list[str] | None):
    """Errors that look like rounding, from a kernel with no narrower float type in it."""
    return narrow_floats == [] and is_precision_like(stats, loc)


def is_precision_like(
    stats: LeafStats, loc: Localisation, narrow_floats: list[str] | None = None
) -> bool:
    """Small, unbiased, spread errors: what rounding in a narrower type produces."""
    scale = stats.ref_max_abs or 1.0
    return (
        stats.rms_rel_error <= precision_rms_bound(narrow_floats)
        and stats.max_abs_error <= PRECISION_PEAK_MAX * scale
        and stats.scale_fit is None
        and stats.offset_fit is None
        and stats.row_scale_range is None
        and loc.spread
    )


def refine_unstable(cases: list[CaseResult], decided: Collection[tuple[str, str]] = ()) -> None:
    """Numeric failures seen only on adversarial profiles, while normal inputs pass → unstable.
    ``decided``: cases (suite, name) a control already judged, with the normal profile at their
    own dims (``forensics.controls``); what normal inputs do at other dims does not override it."""
    normal_passes = any(c.passed for c in cases if c.profile == "normal")
    normal_numeric_fail = any(
        c.failure_class in NUMERIC_CLASSES for c in cases if c.profile == "normal"
    )
    if not normal_passes or normal_numeric_fail:
        return
    for case in cases:
        if (case.suite, case.name) in decided:
            continue
        if case.profile != "normal" and case.failure_class in NUMERIC_CLASSES:
            case.failure_class = "unstable"
            case.diagnosis = (
                f"Passes on normal inputs but fails on the '{case.profile}' value profile: "
                + case.diagnosis
            )


def ranked_classes(classes: Iterable[FailureClass]) -> list[FailureClass]:
    """Distinct classes, most fundamental first: the first is the run's primary class."""
    return sorted(set(classes), key=FAILURE_PRIORITY.index)


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def describe_numeric(
    klass: str, stats: LeafStats, loc: Localisation, narrow_floats: list[str] | None = None
) -> str:
    """One readable paragraph: what is wrong, how much, and where."""
    where = "; ".join(
        f"axis {a.axis}: {a.bad_count}/{a.size} indices bad ({a.bad_ranges})"
        for a in loc.axes
        if a.bad_count
    )
    tiles = ""
    if loc.tiles:
        t = loc.tiles
        tiles = (
            f" Tiles of block {t.block_shape}: {t.tiles_bad}/{t.tiles_total} bad"
            + (", all partial (ragged edge)" if t.only_partial_tiles else "")
            + f", first {t.bad_tiles[:4]}."
        )
    non_finite = ""
    if stats.nan_count or stats.inf_count:  # the error figures below leave them out
        non_finite = (
            f"{stats.nan_count} NaN and {stats.inf_count} Inf where the reference is finite; "
            "among the finite values "
        )
    amount = (
        f"{stats.mismatched}/{stats.total} elements of {stats.path} out of tolerance "
        f"({stats.mismatched_fraction:.1%}); {non_finite}max abs error "
        f"{_fmt(stats.max_abs_error)}, rms error {_fmt(stats.rms_rel_error)} of the reference's "
        f"rms; worst at {stats.worst_index}."
    )
    if klass == "boundary":
        lead = (
            f"Mismatches confined to the ragged tail along axis {loc.tail_axes}: the last, "
            "partial block is not computed or not masked (check the grid rounds up with "
            "pl.cdiv and that reads/writes past the edge are masked)."
        )
    elif klass == "nan_inf":
        lead = _non_finite_lead(stats)
    elif klass == "precision":
        types = f" (the kernel computes in {', '.join(narrow_floats)})" if narrow_floats else ""
        lead = (
            "Errors are small and spread like rounding noise: consistent with a narrower "
            f"intermediate type{types}: bfloat16/float16 accumulation, missing "
            "preferred_element_type."
        )
    else:
        lead = "Values are wrong."
        if computes_wide_only(stats, loc, narrow_floats):
            lead = (
                "Values are slightly wrong, spread like rounding noise, but the kernel computes "
                "in 32-bit floats throughout (no bfloat16/float16 in it), so this is not "
                "precision: look for a mask or bound off by one, an element missing from (or "
                "extra in) a reduction, or a wrong constant."
            )
        elif stats.row_scale_range is not None:
            low, high = stats.row_scale_range
            lead = (
                f"{ROW_FACTOR_LEAD} ({low:.4g} to "
                f"{high:.4g}, rows along the last axis): each row's own normalisation is wrong — "
                "a sum, max or count that takes padded lanes, misses an element (a mask off by "
                "one) or takes the wrong ones."
            )
        elif stats.scale_fit is not None:
            lead = (
                f"{CONSTANT_FACTOR_LEAD} {stats.scale_fit:.6g} of the reference "
                "(wrong scale or normalisation constant)."
            )
        elif stats.offset_fit is not None:
            lead = f"Outputs are offset by a constant {_fmt(stats.offset_fit)} from the reference."
        elif loc.suspected_axis is not None:
            lead = f"Errors are structured, concentrated along axis {loc.suspected_axis}."
    for found in (loc.trigger, loc.follows):
        if found:
            lead = f"{lead} {found}"
    if klass in NUMERIC_CLASSES and not stats.nan_count and at_output_rounding(stats):
        lead = (
            f"Errors are within {ROUNDING_ULPS} ulps of {stats.dtype}, the output type's own "
            "rounding: no kernel can promise less, so the tolerance is tighter than the type "
            "holds (`nearmiss spec check SPEC` measures the reference's noise and suggests one). "
            + lead
        )
    return f"{lead} {amount} {where}.{tiles}".strip()


def _non_finite_lead(stats: LeafStats) -> str:
    counts = f"{stats.nan_count} NaN and {stats.inf_count} Inf where the reference is finite"
    if stats.nan_count + stats.inf_count == stats.total:
        # Nothing local (an edge, a block, a few extreme inputs) spoils every element: it is a
        # value every element's computation goes through, or memory nothing wrote (fresh
        # memory reads as NaN: an output whose index map sends every block elsewhere is all
        # NaN, with no Inf, as a NaN start value is).
        unwritten = ""
        if not stats.inf_count:
            unwritten = (
                " Or the output was never written: fresh memory reads as NaN here, so an "
                "output block index map that sends the blocks elsewhere, or a store that never "
                "runs, leaves all of it NaN."
            )
        return (
            f"Every element is non-finite ({counts}), at every position: not an edge or a few "
            "extreme inputs but a value every element goes through: a running max or sum "
            "started at +inf or NaN (inf - inf, 0 * inf), a rescale exp(a - b) with its "
            "difference reversed (it overflows), or 0/0. Look at the start values of loop "
            f"carries and scratch, and at each exp, log and division.{unwritten}"
        )
    return (
        f"{counts} (uninitialised outputs or accumulators read as NaN in interpret mode; "
        "overflow, e.g. exp of large values, gives Inf/NaN)."
    )


def describe_run(cases: list[CaseResult], primary: str | None) -> str:
    failing = [c for c in cases if not c.passed]
    if not failing:
        return f"All {len(cases)} cases pass."
    compact = [c for c in cases if c.suite == "compact"]
    extended = [c for c in cases if c.suite == "extended"]
    scope = ""
    if compact and extended and all(c.passed for c in compact):
        scope = " The compact suite passes; only the extended suite fails."
    names = ", ".join(f"{c.suite}/{c.name} ({c.failure_class})" for c in failing)
    if not any(c.failure_class == primary for c in failing):
        # The primary class is a target's (a grid race, a refusal), said before this; the
        # cases' own most fundamental class leads their description.
        primary = ranked_classes([c.failure_class for c in failing if c.failure_class])[0]
    first = next(c for c in failing if c.failure_class == primary)
    return (
        f"{primary}: {len(failing)}/{len(cases)} cases fail: {names}.{scope} "
        f"First {primary} case {first.suite}/{first.name}: {first.diagnosis}"
    )
