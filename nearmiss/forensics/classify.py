"""Failure classes (DESIGN.md's vocabulary) and the readable diagnosis of each case and run.

Per case: an exception or dead child decides the class outright; otherwise the numbers do —
ragged tail → ``boundary``; NaN/Inf where the reference is finite → ``nan_inf``; small errors
spread like rounding noise → ``precision``; anything else → ``wrong_values``. Across cases, a
numeric failure confined to adversarial value profiles while normal inputs pass is ``unstable``.
"""

from __future__ import annotations

from nearmiss.models import FAILURE_PRIORITY, CaseResult, ErrorInfo, LeafStats, Localisation

# Reduced precision (bfloat16/float16 intermediates) leaves errors of this size relative to the
# output's scale; a bug in the algorithm leaves larger or structured ones.
PRECISION_RMS_MAX = 0.05
PRECISION_PEAK_MAX = 0.25
NUMERIC_CLASSES = ("nan_inf", "wrong_values", "precision")
COMPILE_PHASES = ("import", "trace", "compile")


def error_class(error: ErrorInfo) -> str:
    """An exception is a compile_error before the kernel runs, a runtime_error once it does —
    except running out of memory, which is a runtime failure in whatever phase it strikes."""
    out_of_memory = error.type == "MemoryError" or "RESOURCE_EXHAUSTED" in error.message
    if error.phase in COMPILE_PHASES and not out_of_memory:
        return "compile_error"
    return "runtime_error"


def classify_numeric(
    stats: LeafStats, loc: Localisation, narrow_floats: list[str] | None = None
) -> str:
    """``narrow_floats``: the float types under 32 bits the kernel computes in (None: unknown).
    Small spread errors from a kernel with none are not rounding in a narrower type."""
    if loc.tail_only:
        return "boundary"
    if stats.nan_count or stats.inf_count:
        return "nan_inf"
    if is_precision_like(stats, loc) and narrow_floats != []:
        return "precision"
    return "wrong_values"


def computes_wide_only(stats: LeafStats, loc: Localisation, narrow_floats: list[str] | None):
    """Errors that look like rounding, from a kernel with no narrower float type in it."""
    return narrow_floats == [] and is_precision_like(stats, loc)


def is_precision_like(stats: LeafStats, loc: Localisation) -> bool:
    """Small, unbiased, spread errors: what rounding in a narrower type produces."""
    scale = stats.ref_max_abs or 1.0
    return (
        stats.rms_rel_error <= PRECISION_RMS_MAX
        and stats.max_abs_error <= PRECISION_PEAK_MAX * scale
        and stats.scale_fit is None
        and stats.offset_fit is None
        and loc.spread
    )


def refine_unstable(cases: list[CaseResult]) -> None:
    """Numeric failures seen only on adversarial profiles, while normal inputs pass → unstable."""
    normal_passes = any(c.passed for c in cases if c.profile == "normal")
    normal_numeric_fail = any(
        c.failure_class in NUMERIC_CLASSES for c in cases if c.profile == "normal"
    )
    if not normal_passes or normal_numeric_fail:
        return
    for case in cases:
        if case.profile != "normal" and case.failure_class in NUMERIC_CLASSES:
            case.failure_class = "unstable"
            case.diagnosis = (
                f"Passes on normal inputs but fails on the '{case.profile}' value profile: "
                + case.diagnosis
            )


def ranked_classes(classes: list[str]) -> list[str]:
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
        lead = (
            f"{stats.nan_count} NaN and {stats.inf_count} Inf where the reference is finite "
            "(uninitialised outputs or accumulators read as NaN in interpret mode; overflow, "
            "e.g. exp of large values, gives Inf/NaN)."
        )
    elif klass == "precision":
        lead = (
            "Errors are small and spread like rounding noise: consistent with a narrower "
            "intermediate type (bfloat16/float16 accumulation, missing preferred_element_type)."
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
        elif stats.scale_fit is not None:
            lead = (
                f"Outputs are a constant factor {stats.scale_fit:.6g} of the reference "
                "(wrong scale or normalisation constant)."
            )
        elif stats.offset_fit is not None:
            lead = f"Outputs are offset by a constant {_fmt(stats.offset_fit)} from the reference."
        elif loc.suspected_axis is not None:
            lead = f"Errors are structured, concentrated along axis {loc.suspected_axis}."
    return f"{lead} {amount} {where}.{tiles}".strip()


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
