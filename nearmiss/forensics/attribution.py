"""Which input positions the error follows: localisation along an axis the output reduces away.

A reduction that takes one element too many or too few — a mask off by one, a bound that stops
short — leaves an error that follows that element: ``out - ref ≈ c · x[..., s, ...]``. The output
has no axis for the reduced one, so the error's place on the output cannot say which ``s``; its
correlation with each slice of an input along that axis can. Per output row, the position whose
slice best explains the row's error is the suspect; when it is the same for every failing row,
follows the row's own index (a diagonal) or a per-row integer input (a length), the diagnosis
names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_FEATURES = 8  # a correlation over fewer values proves little
MIN_POSITIONS = 8  # a reduced axis shorter than this is no reduction worth naming
STRONG = 0.9  # the median failing row's best correlation must reach this
MAX_ROWS = 512  # failing rows looked at (the first ones)
MAX_VALUES = 4_000_000  # input values gathered for one candidate axis (32 MB of float64)
OFFSETS = (-1, 0, 1)
AGREEMENT = 0.9  # the share of failing rows a stated relation must hold for


@dataclass(frozen=True)
class Attribution:
    input: str
    axis: int  # of the input
    size: int
    positions: np.ndarray  # per failing row, the suspect position
    strength: float  # median |correlation| over the failing rows
    rows: np.ndarray  # (count, output rank - 1) coordinates of the failing rows, feature axis out
    row_axes: tuple[int, ...]  # the output axes those coordinates index
    out_shape: tuple[int, ...]


def _match(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[int, int] | None:
    """Input axes (of ``shape``, in order) onto output axes of the same size, in order."""
    mapping, start = {}, 0
    for axis, size in enumerate(shape):
        for out_axis in range(start, len(out_shape)):
            if out_shape[out_axis] == size:
                mapping[axis] = out_axis
                start = out_axis + 1
                break
        else:
            return None
    return mapping


def _correlations(values: np.ndarray, slices: np.ndarray) -> np.ndarray:
    """Per row, the correlation of ``values`` (n, F) with each slice of ``slices`` (n, R, F)."""
    v = values - values.mean(axis=-1, keepdims=True)
    x = slices - slices.mean(axis=-1, keepdims=True)
    norms = np.linalg.norm(v, axis=-1)[:, None] * np.linalg.norm(x, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        corr = np.where(norms > 0, np.einsum("nf,nrf->nr", v, x) / norms, 0.0)
    # Non-finite inputs (an adversarial profile's huge values) correlate with nothing.
    return np.clip(np.nan_to_num(corr, nan=0.0, posinf=0.0, neginf=0.0), -1.0, 1.0)


def _candidate(
    name: str,
    x: np.ndarray,
    reduced: int,
    error: np.ndarray,
    mask: np.ndarray,
    reference: np.ndarray,
):
    """The attribution of ``error`` to ``x``'s slices along ``reduced``, or None when the
    input's other axes do not line up with the output's."""
    rest = tuple(a for a in range(x.ndim) if a != reduced)
    mapping = _match(tuple(x.shape[a] for a in rest), error.shape)
    if mapping is None:
        return None
    matched = {rest[i]: out for i, out in mapping.items()}
    features = [a for a in rest if x.shape[a] >= MIN_FEATURES]
    if not features:
        return None
    feature_in = features[-1]
    feature_out = matched[feature_in]
    row_axes = tuple(a for a in range(error.ndim) if a != feature_out)
    # Rows: every output position but along the feature axis; a row fails if any element does.
    # Rows holding NaN or Inf say nothing about which element was taken: left out.
    e = np.moveaxis(error, feature_out, -1)
    usable = np.moveaxis(mask, feature_out, -1).any(axis=-1) & np.isfinite(e).all(axis=-1)
    # Bounded work: (rows x positions x features) values at most; fewer rows when larger.
    per_row = x.shape[reduced] * x.shape[feature_in]
    rows = np.argwhere(usable)[: min(MAX_ROWS, MAX_VALUES // per_row)]
    if not len(rows):
        return None
    e_rows = e[tuple(rows.T)]  # (n, F)
    # The input as (its matched row axes..., R, F): indexed by each row's coordinates.
    by_output = {out: axis for axis, out in matched.items()}
    present = [i for i, a in enumerate(row_axes) if a in by_output]
    xt = np.transpose(x, [by_output[row_axes[i]] for i in present] + [reduced, feature_in])
    x_rows = (
        xt[tuple(rows[:, i] for i in present)]
        if present
        else np.broadcast_to(xt, (len(rows), *xt.shape))
    )  # (n, R, F)
    corr = np.abs(_correlations(e_rows, x_rows))
    best = corr.argmax(axis=-1)
    strength = float(np.median(corr[np.arange(len(rows)), best]))
    # Where the reference itself follows that slice, it is the output's own source (a scale or
    # offset error of an elementwise path), not an element a reduction took or dropped.
    r_rows = np.moveaxis(reference, feature_out, -1)[tuple(rows.T)]
    own = np.abs(_correlations(r_rows, x_rows))[np.arange(len(rows)), best]
    if np.all(np.isfinite(r_rows)) and float(np.median(own)) >= STRONG:
        return None
    return Attribution(name, reduced, x.shape[reduced], best, strength, rows, row_axes, error.shape)


def _offset(values: np.ndarray, positions: np.ndarray) -> int | None:
    """k such that positions = values + k in nearly every row (a row or two at an edge, such
    as a first query with no key to lose, may follow something else)."""
    for k in OFFSETS:
        if np.mean(positions == values + k) >= AGREEMENT:
            return k
    return None


def _describe(found: Attribution, integers: Sequence[tuple[str, np.ndarray]]) -> str | None:
    positions = found.positions
    common = np.bincount(positions).argmax()
    if np.mean(positions == common) >= AGREEMENT:
        where = f"position {int(common)}"
        if common == found.size - 1:
            where += " (its last)"
        elif common == 0:
            where += " (its first)"
        return where
    for i, out_axis in enumerate(found.row_axes):
        k = _offset(found.rows[:, i], positions)
        if k is not None:
            shift = f" {'+' if k > 0 else '-'} {abs(k)}" if k else ""
            return f"the output's own index along axis {out_axis}{shift} (a diagonal)"
    for name, values in integers:
        if values.ndim != 1:
            continue
        for i, out_axis in enumerate(found.row_axes):
            if found.out_shape[out_axis] != values.shape[0]:
                continue  # a per-row value indexes an output axis of its own length
            coords = found.rows[:, i]
            k = _offset(values[coords].astype(np.int64), positions)
            if k is None:
                continue
            if k == -1:
                return f"{name} - 1, each row's last valid position"
            if k == 0:
                return f"{name}, the first position past each row's valid ones"
            return f"{name} + {k}"
    return None  # a position per row that follows nothing: no lead worth giving


def attribute_error(
    output: np.ndarray,
    reference: np.ndarray,
    mask: np.ndarray,
    inputs: Sequence[tuple[str, np.ndarray]],
) -> str | None:
    """One sentence naming the input positions the error follows, or None.

    ``output`` and ``reference`` are one output leaf's, ``mask`` its elements out of tolerance;
    ``inputs`` the case's (name, array) pairs. Every float input and every one of its axes is
    tried as the reduced one; the best-explained wins, if it explains well enough."""
    if output.ndim == 0 or not mask.any():
        return None
    if output.ndim == 1:  # one row: a leading axis of one, so rows are always 2-D
        output, reference, mask = output[None], reference[None], mask[None]
    reference = reference.astype(np.float64)
    error = output.astype(np.float64) - reference
    integers = [(n, v) for n, v in inputs if v.dtype.kind in "iu"]
    best: Attribution | None = None
    for name, x in inputs:
        if x.dtype.kind in "iub" or x.ndim < 2:
            continue
        x = np.asarray(x, np.float64)
        for reduced in range(x.ndim):
            if x.shape[reduced] < MIN_POSITIONS:
                continue  # picking one of two positions proves little
            found = _candidate(name, x, reduced, error, mask, reference)
            if found is not None and (best is None or found.strength > best.strength):
                best = found
    if best is None or best.strength < STRONG:
        return None
    where = _describe(best, integers)
    if where is None:
        return None
    return (
        f"The error follows {best.input} along its axis {best.axis} (size {best.size}, reduced "
        f"away in the output) at {where}: correlation "
        f"{best.strength:.2f} in the median of {len(best.positions)} failing rows — an element "
        "of the reduction taken or dropped there."
    )
