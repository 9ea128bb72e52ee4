"""Compare a candidate's outputs with the reference's: structure first, then numbers.

A case passes when every element satisfies ``|out - ref| <= atol + rtol * |ref|`` and NaN/Inf
appear only where the reference has them (with the same sign for Inf); output shape, dtype and
pytree structure must equal the reference's.

Each leaf also says how much of its tolerance it used (``tolerance_used``): a passing case at 0.9
is one unlucky seed away from failing, which the verdict alone does not show.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nearmiss.engine.models import LeafStats

# A fit (out ≈ c·ref or out ≈ ref + b) "explains" the error when it removes this much of it.
FIT_EXPLAINS = 0.25
_TINY = 1e-30


@dataclass
class LeafComparison:
    stats: LeafStats
    bad: np.ndarray  # boolean mask of mismatched elements, the leaf's shape


def leaf_name(index: int, count: int) -> str:
    return "out" if count == 1 else f"out[{index}]"


def structure_difference(
    ref: list[np.ndarray], ref_tree: str, out: list[np.ndarray], out_tree: str
) -> str | None:
    """What differs in pytree structure, shapes or dtypes; None when they all match."""
    if ref_tree != out_tree or len(ref) != len(out):
        return f"output structure {out_tree} differs from the reference's {ref_tree}"
    problems = []
    for index, (r, o) in enumerate(zip(ref, out, strict=True)):
        if r.shape != o.shape or r.dtype != o.dtype:
            problems.append(
                f"{leaf_name(index, len(ref))} is {o.dtype.name}{list(o.shape)}, "
                f"the reference's is {r.dtype.name}{list(r.shape)}"
            )
    return "; ".join(problems) or None


def _fit_residuals(
    out: np.ndarray, ref: np.ndarray, err_rms: float
) -> tuple[float | None, float | None]:
    """(scale, offset) fits that explain the error, each None when it does not."""
    if out.size < 2 or err_rms <= 0:
        return None, None
    scale = offset = None
    denom = float(np.dot(ref, ref))
    if denom > _TINY:
        c = float(np.dot(out, ref)) / denom
        if np.sqrt(np.mean((out - c * ref) ** 2)) < FIT_EXPLAINS * err_rms:
            scale = c
    b = float(np.mean(out - ref))
    if np.sqrt(np.mean((out - ref - b) ** 2)) < FIT_EXPLAINS * err_rms:
        offset = b
    return scale, offset


def tolerance_used(err: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float | None:
    """max(|out - ref| / (atol + rtol·|ref|)) over finite elements (``err`` = |out - ref|):
    0 means exact, 1 means some element sits right on the tolerance, above 1 fails.

    An element with no error counts 0 even where its tolerance is 0 (0/0: exact is exact). An
    element with an error where its tolerance is 0 (atol = rtol = 0, as integer outputs get,
    or atol = 0 at ref = 0) has no finite ratio: the figure is then None (JSON has no infinity),
    and that element is a mismatch, so a passing leaf always has a number.
    """
    if not err.size:
        return 0.0
    allowed = atol + rtol * np.abs(ref)
    if np.any((allowed <= 0) & (err > 0)):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err > 0, err / np.where(allowed > 0, allowed, 1.0), 0.0)
    worst = float(ratio.max())
    return worst if np.isfinite(worst) else None  # a subnormal tolerance can overflow it


# Per-row factors that differ by more than this (relative) are not one constant factor.
ROW_SCALE_SPREAD = 0.01


def _row_scales(out: np.ndarray, ref: np.ndarray, err_rms: float) -> list[float] | None:
    """[min, max] of per-row factors c_r (out ≈ c_r·ref along the last axis) when they differ
    by row and explain the error; None otherwise (or when some value is not finite)."""
    if out.ndim < 2 or err_rms <= 0 or not (np.isfinite(out).all() and np.isfinite(ref).all()):
        return None
    rows_out = out.reshape(-1, out.shape[-1])
    rows_ref = ref.reshape(-1, ref.shape[-1])
    power = np.einsum("rf,rf->r", rows_ref, rows_ref)
    keep = power > _TINY
    if keep.sum() < 2:
        return None
    scales = np.einsum("rf,rf->r", rows_out[keep], rows_ref[keep]) / power[keep]
    residual = rows_out[keep] - scales[:, None] * rows_ref[keep]
    if np.sqrt(np.mean(residual**2)) >= FIT_EXPLAINS * err_rms:
        return None
    low, high = float(scales.min()), float(scales.max())
    if high - low <= ROW_SCALE_SPREAD * max(abs(float(np.median(scales))), _TINY):
        return None
    return [low, high]


def compare_leaf(
    name: str, ref: np.ndarray, out: np.ndarray, atol: float, rtol: float
) -> LeafComparison:
    r, o = ref.astype(np.float64), out.astype(np.float64)
    ref_finite = np.isfinite(r)
    out_finite = np.isfinite(o)
    both = ref_finite & out_finite
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(both, np.abs(o - r), 0.0)
    close = both & (err <= atol + rtol * np.abs(r))
    close |= np.isnan(r) & np.isnan(o)
    close |= np.isinf(r) & (o == r)
    bad = ~close
    nan_count = int(np.sum(np.isnan(o) & ref_finite))
    inf_count = int(np.sum(np.isinf(o) & ref_finite))
    finite_err, finite_ref, finite_out = err[both], r[both], o[both]
    ref_rms = float(np.sqrt(np.mean(finite_ref**2))) if finite_ref.size else 0.0
    err_rms = float(np.sqrt(np.mean(finite_err**2))) if finite_err.size else 0.0
    mismatched = int(bad.sum())
    worst = None
    if mismatched:
        # NaN/Inf where the reference is finite is the worst kind of mismatch.
        nonfinite = bad & ref_finite & ~out_finite
        flat = np.argmax(nonfinite) if nonfinite.any() else np.argmax(np.where(bad, err, -1.0))
        worst = [int(i) for i in np.unravel_index(flat, bad.shape)]
    scale, offset, row_scales = None, None, None
    if mismatched and finite_err.size:
        scale, offset = _fit_residuals(finite_out, finite_ref, err_rms)
        row_scales = _row_scales(o, r, err_rms)
        if row_scales is not None:
            scale = None  # one factor per row, not one for all
    rel = finite_err / (np.abs(finite_ref) + atol + _TINY) if finite_err.size else finite_err
    stats = LeafStats(
        path=name,
        shape=list(out.shape),
        dtype=out.dtype.name,
        total=int(bad.size),
        mismatched=mismatched,
        mismatched_fraction=mismatched / max(bad.size, 1),
        max_abs_error=float(finite_err.max()) if finite_err.size else 0.0,
        max_rel_error=float(rel.max()) if rel.size else 0.0,
        rms_rel_error=err_rms / (ref_rms + _TINY) if err_rms else 0.0,
        nan_count=nan_count,
        inf_count=inf_count,
        ref_max_abs=float(np.abs(finite_ref).max()) if finite_ref.size else 0.0,
        tolerance_used=tolerance_used(finite_err, finite_ref, atol, rtol),
        worst_index=worst,
        scale_fit=scale,
        offset_fit=offset,
        row_scale_range=row_scales,
    )
    return LeafComparison(stats, bad)


def compare_outputs(
    ref: list[np.ndarray], out: list[np.ndarray], atol: float, rtol: float
) -> list[LeafComparison]:
    """Per-leaf comparison; call only after structure_difference found nothing."""
    return [
        compare_leaf(leaf_name(i, len(ref)), r, o, atol, rtol)
        for i, (r, o) in enumerate(zip(ref, out, strict=True))
    ]
