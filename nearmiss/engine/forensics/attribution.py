"""Which input positions the error follows: localisation along an axis the output reduces away.

A reduction that takes one element too many or too few — a mask off by one, a bound that stops
short — leaves an error that follows that element: ``out - ref ≈ c · x[..., s, ...]``. The output
has no axis for the reduced one, so the error's place on the output cannot say which ``s``; its
correlation with each slice of an input along that axis can. Per output row, the position whose
slice best explains the row's error is the suspect; when it is the same for every failing row,
follows the row's own index (a diagonal) or a per-row integer input (a length), the diagnosis
names it. When no single slice explains the rows, a few positions every row shares may together
(a split-K mask dropping each split's first key); or the sum of a run of positions (a length
mask multiplied into the logits instead of sending them to -inf lets the padding in, each
padding key with the same weight, up to where the loop stops); and when each row's error
follows one slice with no rule for which, one element dominates a reduction that should weigh
many (a softmax made too sharp).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

MIN_FEATURES = 8  # a correlation over fewer values proves little
MIN_POSITIONS = 8  # a reduced axis shorter than this is no reduction worth naming
STRONG = 0.9  # the median failing row's best correlation must reach this
MAX_ROWS = 512  # failing rows looked at (the first ones)
MAX_VALUES = 4_000_000  # input values gathered for one candidate axis (32 MB of float64)
OFFSETS = (-1, 0, 1)
AGREEMENT = 0.9  # the share of failing rows a stated relation must hold for
MAX_SITES = 4  # positions the pursuit picks per row (a few blocks' edges)
MIN_FEATURES_PER_SITE = 4  # features per fitted coefficient, so a fit cannot just memorise
# A different position per row is a lead only over enough features: the best of a few hundred
# slices correlates well with noise over eight.
DOMINANT_FEATURES = 32
# The pursuit's and the span's: several positions, or a boundary, chosen per row.
PURSUIT_MIN_ROWS = 8
PURSUIT_MIN_POSITIONS = 32  # the pursuit picks up to MAX_SITES of them per row
PURSUIT_ROWS = 64  # rows the pursuit fits: enough for a common set, cheap enough per check
ROUNDS_OF_ENDS = 2  # a run's two ends, each moved this many times (_span)
SPAN_ROWS = 16  # rows a run is fitted on: one end scored at every position costs rows x axis x F


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
    features: int  # values each correlation was taken over


@dataclass(frozen=True)
class Sites:
    """Several positions of ``input``'s ``axis`` that every failing row's error follows."""

    input: str
    axis: int
    size: int
    positions: tuple[int, ...]
    strength: float  # median correlation of the rows' fits
    row_count: int


@dataclass(frozen=True)
class Span:
    """A run of ``input``'s ``axis`` whose sum every failing row's error follows."""

    input: str
    axis: int
    size: int
    starts: np.ndarray  # per failing row: the run is [start, end)
    ends: np.ndarray
    strength: float  # median correlation of the rows' best runs
    rows: np.ndarray
    row_axes: tuple[int, ...]
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


def _centred(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` less its mean along the last axis, and the norms of what is left."""
    x = x - x.mean(axis=-1, keepdims=True)
    return x, np.linalg.norm(x, axis=-1)


def _correlations(
    values: np.ndarray, slices: np.ndarray | tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Per row, the correlation of ``values`` (n, F) with each slice of ``slices`` (n, R, F).
    Where several ``values`` meet the same slices, pass ``_centred(slices)`` once: centring the
    (n, R, F) slices is most of the work."""
    v, v_norms = _centred(values)
    x, x_norms = slices if isinstance(slices, tuple) else _centred(slices)
    norms = v_norms[:, None] * x_norms
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        corr = np.where(norms > 0, np.einsum("nf,nrf->nr", v, x) / norms, 0.0)
    # Non-finite inputs (an adversarial profile's huge values) correlate with nothing.
    return np.clip(np.nan_to_num(corr, nan=0.0, posinf=0.0, neginf=0.0), -1.0, 1.0)


@dataclass(frozen=True)
class _Rows:
    """The failing rows of one (input, reduced axis) pairing, gathered for fitting."""

    rows: np.ndarray  # (n, output rank - 1) coordinates, feature axis out
    row_axes: tuple[int, ...]
    errors: np.ndarray  # (n, F)
    slices: np.ndarray  # (n, R, F): the input's slices along the reduced axis, per row
    references: np.ndarray  # (n, F)


def _gather(
    x: np.ndarray,
    reduced: int,
    error: np.ndarray,
    mask: np.ndarray,
    reference: np.ndarray,
    limit: int = MAX_ROWS,
) -> _Rows | None:
    """The failing rows' errors, references and ``x``'s slices along ``reduced``, or None when
    the input's other axes do not line up with the output's."""
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
    rows = np.argwhere(usable)[: min(limit, MAX_VALUES // per_row)]
    if not len(rows):
        return None
    # The input as (its matched row axes..., R, F): indexed by each row's coordinates.
    by_output = {out: axis for axis, out in matched.items()}
    present = [i for i, a in enumerate(row_axes) if a in by_output]
    xt = np.transpose(x, [by_output[row_axes[i]] for i in present] + [reduced, feature_in])
    slices = (
        xt[tuple(rows[:, i] for i in present)]
        if present
        else np.broadcast_to(xt, (len(rows), *xt.shape))
    )
    references = np.moveaxis(reference, feature_out, -1)[tuple(rows.T)]
    return _Rows(rows, row_axes, e[tuple(rows.T)], slices, references)


def _candidate(name: str, reduced: int, g: _Rows, shape) -> Attribution | None:
    """The attribution of each failing row's error to its best-correlated slice of ``x``."""
    slices = _centred(g.slices)
    corr = np.abs(_correlations(g.errors, slices))
    best = corr.argmax(axis=-1)
    n = len(g.rows)
    strength = float(np.median(corr[np.arange(n), best]))
    # Where the reference itself follows that slice, it is the output's own source (a scale or
    # offset error of an elementwise path), not an element a reduction took or dropped.
    own = np.abs(_correlations(g.references, slices))[np.arange(n), best]
    if np.all(np.isfinite(g.references)) and float(np.median(own)) >= STRONG:
        return None
    size, features = g.slices.shape[1:]
    return Attribution(name, reduced, size, best, strength, g.rows, g.row_axes, shape, features)


def _residuals(errors: np.ndarray, regressors: np.ndarray) -> np.ndarray:
    """Per row, what least squares on ``regressors`` (n, F, p) leaves of ``errors`` (n, F)."""
    coefficients = np.linalg.pinv(regressors) @ errors[..., None]
    return errors - (regressors @ coefficients)[..., 0]


def _several(name: str, reduced: int, g: _Rows) -> Sites | None:
    """The same few positions explaining every failing row's error together: a mask or bound
    off by one at each block's edge drops one element per block, and no single slice follows.

    Per row, a greedy pursuit picks up to MAX_SITES slices; the error is fitted on them with
    the reference's own row and a constant (what renormalising — a softmax's denominator —
    adds to every element). Positions picked in nearly every row are the common set; random
    picks scatter over the axis and are never common. The set is kept if, fitted in every
    row, it explains what the constant and the reference leave of the error (median
    correlation of the fit at least STRONG)."""
    n, size, features = g.slices.shape
    if n < PURSUIT_MIN_ROWS or features < MIN_FEATURES_PER_SITE * (MAX_SITES + 2):
        return None  # over a few rows every pick is "common"; over few features every fit fits
    if size < PURSUIT_MIN_POSITIONS:
        return None  # picking four of eight positions names half the axis: no finding
    if not np.isfinite(g.references).all():
        return None
    with np.errstate(all="ignore"):
        slices = np.nan_to_num(g.slices)
        centred = _centred(slices)
        base = np.stack([np.ones_like(g.references), g.references], axis=-1)  # (n, F, 2)
        left = _residuals(g.errors, base)
        picked = np.zeros((n, size), bool)
        order = np.zeros((n, 0), int)  # each row's picks, in the order picked
        for _ in range(MAX_SITES):
            # A picked position can never win again (-1), nor can one that explains nothing.
            corr = np.where(picked, -1.0, np.abs(_correlations(left, centred)))
            pick = corr.argmax(axis=-1)
            useful = corr[np.arange(n), pick] > 0
            picked[np.arange(n)[useful], pick[useful]] = True
            order = np.concatenate([order, pick[:, None]], axis=1)
            chosen = np.take_along_axis(slices, order[..., None], axis=1)  # (n, k, F)
            left = _residuals(g.errors, np.concatenate([base, np.swapaxes(chosen, 1, 2)], -1))
        common = np.nonzero(picked.mean(axis=0) >= AGREEMENT)[0]
        if len(common) < 2:
            return None
        fit = np.concatenate([base, np.swapaxes(slices[:, common], 1, 2)], axis=-1)
        left = _residuals(g.errors, fit)
        # Judged on what the constant and the reference leave: a scale error of the whole row
        # is explained by the reference alone, and the slices must explain the rest.
        unexplained = _residuals(g.errors, base)
        explained = 1.0 - (left**2).sum(-1) / (unexplained**2).sum(-1)
    strength = float(np.sqrt(max(float(np.nanmedian(explained)), 0.0)))
    if not np.isfinite(strength) or strength < STRONG:
        return None
    return Sites(name, reduced, size, tuple(int(p) for p in common), strength, n)


def _span(name: str, reduced: int, g: _Rows, shape) -> Span | None:
    """The run of positions [start, end) whose summed slices best explain each failing row's
    error beyond a constant and the reference's own row (what a softmax's renormalisation
    adds): a mask that lets padding in, each padding element with one weight, or a bound that
    stops short. Every run of an axis is too many to score; a prefix sum scores all runs with
    one end fixed, so each row starts from its best tail or head and then moves one end at a
    time (ROUNDS_OF_ENDS), each move scoring every position for that end."""
    n, size, features = g.slices.shape
    if n < PURSUIT_MIN_ROWS or features < MIN_FEATURES_PER_SITE * (MAX_SITES + 2):
        return None  # two ends picked from the axis fit noise over few features
    if size < PURSUIT_MIN_POSITIONS or not np.isfinite(g.references).all():
        return None
    rows = np.arange(n)
    with np.errstate(all="ignore"):
        base = np.stack([np.ones_like(g.references), g.references], axis=-1)  # (n, F, 2)
        left = _residuals(g.errors, base)
        basis, _ = np.linalg.qr(base)  # what the constant and the reference span, per row
        zero = np.zeros_like(g.slices[:, :1])
        prefix = np.concatenate([zero, np.cumsum(np.nan_to_num(g.slices), axis=1)], axis=1)

        def scores(runs: np.ndarray, valid: np.ndarray) -> np.ndarray:
            """|correlation| of each (n, K, F) run, beyond the base, with what it leaves."""
            runs = runs - (runs @ basis) @ np.swapaxes(basis, 1, 2)
            return np.where(valid, np.abs(_correlations(left, runs)), -1.0)

        ends = np.arange(size + 1)[None, :]
        whole = (ends == 0) | (ends == size)  # the whole axis is the reduction itself
        tails = scores(prefix[:, -1:] - prefix, ~whole)  # [start, size)
        heads = scores(prefix, ~whole)  # [0, end)
        start, end = tails.argmax(-1), np.full(n, size)
        use_head = heads.max(-1) > tails.max(-1)
        start[use_head], end[use_head] = 0, heads.argmax(-1)[use_head]
        for _ in range(ROUNDS_OF_ENDS):
            ok = (ends > start[:, None]) & ~((start[:, None] == 0) & (ends == size))
            best = scores(prefix - prefix[rows, start][:, None], ok)
            end = best.argmax(-1)
            ok = (ends < end[:, None]) & ~((ends == 0) & (end[:, None] == size))
            best = scores(prefix[rows, end][:, None] - prefix, ok)
            start = best.argmax(-1)
        strength = float(np.median(best[rows, start]))
    if not np.isfinite(strength) or strength < STRONG:
        return None
    return Span(name, reduced, size, start, end, strength, g.rows, g.row_axes, shape)


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
    followed = _follows_integer(found, positions, integers)
    if followed is None:
        return None  # a position per row that follows nothing: no lead worth giving
    name, k = followed
    if k == -1:
        return f"{name} - 1, each row's last valid position"
    if k == 0:
        return f"{name}, the first position past each row's valid ones"
    return f"{name} + {k}"


def _follows_integer(
    found: Attribution | Span, positions: np.ndarray, integers: Sequence[tuple[str, np.ndarray]]
) -> tuple[str, int] | None:
    """(name, k): each failing row's position is a per-row integer input's value + k (a
    length), in nearly every row."""
    for name, values in integers:
        if values.ndim != 1:
            continue
        for i, out_axis in enumerate(found.row_axes):
            if found.out_shape[out_axis] != values.shape[0]:
                continue  # a per-row value indexes an output axis of its own length
            k = _offset(values[found.rows[:, i]].astype(np.int64), positions)
            if k is not None:
                return name, k
    return None


def attribute_error(
    output: np.ndarray,
    reference: np.ndarray,
    mask: np.ndarray,
    inputs: Sequence[tuple[str, np.ndarray]],
) -> str | None:
    """One sentence naming the input positions the error follows, or None.

    ``output`` and ``reference`` are one output leaf's, ``mask`` its elements out of tolerance;
    ``inputs`` the case's (name, array) pairs. Every float input and every one of its axes is
    tried as the reduced one; the best-explained wins, if it explains well enough: one position
    per row with a rule, else several positions shared by every row, else one scattered
    position per row (see the module's docstring)."""
    if output.ndim == 0 or not mask.any():
        return None
    if output.ndim == 1:  # one row: a leading axis of one, so rows are always 2-D
        output, reference, mask = output[None], reference[None], mask[None]
    reference = reference.astype(np.float64)
    error = output.astype(np.float64) - reference
    integers = [(n, v) for n, v in inputs if v.dtype.kind in "iu"]
    pairings = [
        (name, x, reduced)
        for name, x in inputs
        if x.dtype.kind not in "iub" and x.ndim >= 2
        for reduced in range(x.ndim)
        if x.shape[reduced] >= MIN_POSITIONS  # picking one of two positions proves little
    ]

    def strongest(fit, limit: int):
        """The strongest of ``fit``'s findings over the pairings, on up to ``limit`` rows."""
        found = None
        for name, x, reduced in pairings:
            rows = _gather(np.asarray(x, np.float64), reduced, error, mask, reference, limit)
            this = rows and fit(name, reduced, rows)
            if this and (found is None or this.strength > found.strength):
                found = this
        return found

    best: Attribution | None = strongest(partial(_candidate, shape=error.shape), MAX_ROWS)
    where = _describe(best, integers) if best and best.strength >= STRONG else None
    if best and where:
        return (
            f"The error follows {best.input} along its axis {best.axis} (size {best.size}, "
            f"reduced away in the output) at {where}: correlation {best.strength:.2f} in the "
            f"median of {len(best.positions)} failing rows — an element of the reduction taken "
            "or dropped there."
        )
    # Only now, when no single slice is a lead: the pursuit and the run cost more.
    several: Sites | None = strongest(_several, PURSUIT_ROWS)
    if several:
        return _several_sentence(several)
    span: Span | None = strongest(partial(_span, shape=error.shape), SPAN_ROWS)
    said = span and _span_sentence(span, integers)
    if said:
        return said
    if best and best.strength >= STRONG and best.features >= DOMINANT_FEATURES and _spread(best):
        return _dominant_sentence(best)
    return None


def _spread(found: Attribution) -> bool:
    """Whether the rows' positions scatter (no position in half the rows, distinct positions
    for a quarter of them at least): a common position with a few strays is not 'a different
    one per row'."""
    n = len(found.positions)
    return np.bincount(found.positions).max() < n / 2 and len(np.unique(found.positions)) >= n / 4


def _dominant_sentence(found: Attribution) -> str:
    """Each row's error follows one slice, a different one per row, with no rule: the row's
    result is one element where the reference weighs many — a softmax made too sharp (logits
    scaled up), or one element picked where a weighted sum belongs."""
    return (
        f"Each failing row's error follows a single element of {found.input} along its axis "
        f"{found.axis} (size {found.size}, reduced away in the output), a different one per row "
        f"({len(np.unique(found.positions))} positions over {len(found.positions)} rows; "
        f"correlation {found.strength:.2f} in the median): one element dominates each row's "
        "reduction where the reference weighs many — weights too sharp (logits scaled up, a "
        "scale inverted) or one element picked where a weighted sum belongs."
    )


def _several_sentence(best: Sites) -> str:
    """The sentence for several positions every failing row follows together."""
    return (
        f"The error follows {best.input} along its axis {best.axis} (size {best.size}, reduced "
        f"away in the output) at {_positions(best.positions)}, together: a fit on those "
        f"slices explains it with correlation {best.strength:.2f} in the median of "
        f"{best.row_count} failing rows — one element of the reduction taken or dropped at each."
    )


def _span_sentence(span: Span, integers: Sequence[tuple[str, np.ndarray]]) -> str | None:
    """The sentence for a run every failing row's error follows, where each of its ends is one
    position for every row or follows a per-row integer input; else None (no rule, no lead)."""
    start = _edge(span, span.starts, integers)
    end = _edge(span, span.ends, integers)
    if start is None or end is None:
        return None
    if start == "0":
        where, edges = f"from its start up to {end}", end
    elif end == str(span.size):
        where, edges = f"from {start} to its end", start
    elif start.isdigit() and end.isdigit():
        where, edges = f"{start}-{int(end) - 1}", f"{start} and {end}"
    else:
        where, edges = f"from {start} up to {end}", f"{start} and {end}"
    return (
        f"The error follows the sum of {span.input} along its axis {span.axis} (size "
        f"{span.size}, reduced away in the output) over the positions {where}: correlation "
        f"{span.strength:.2f} in the median of {len(span.starts)} failing rows — those "
        "elements taken into the reduction where the reference leaves them out, or left out "
        f"where it takes them (a mask or a bound at {edges})."
    )


def _edge(
    span: Span, positions: np.ndarray, integers: Sequence[tuple[str, np.ndarray]]
) -> str | None:
    """A run's end in words: the position every row shares, or a per-row integer input."""
    common = int(np.bincount(positions).argmax())
    if np.mean(positions == common) >= AGREEMENT:
        return str(common)
    followed = _follows_integer(span, positions, integers)
    if followed is None:
        return None
    name, k = followed
    return f"{name} {'+' if k > 0 else '-'} {abs(k)}" if k else name


def _positions(positions: tuple[int, ...]) -> str:
    """ "positions 0, 128 and 256 (each the first of a block of 128)": a block edge named when
    every position is the first (or the last) of a block of one size."""
    listed = ", ".join(str(p) for p in positions[:-1]) + f" and {positions[-1]}"
    for word, shift in (("first", 0), ("last", 1)):
        block = int(np.gcd.reduce(np.array(positions) + shift))  # divides every position
        if block >= MIN_POSITIONS:
            return f"positions {listed} (each the {word} of a block of {block})"
    return f"positions {listed}"
