"""Which outputs one input element reaches: the kernel's footprint against the reference's.

When one case's numbers give no lead (no trigger, no input positions the error follows), the
engine can still ask the kernel a question an engineer would: move one element of an input and
see which outputs move. The reference's footprint is the computation's structure — a row norm
moves its whole row, attention moves every query that sees the key — and the kernel's should
be the same. Where it is not, the difference names the axis: a reduction missing or cut short
(the kernel moves only the element's own output where the reference moves its row), an element
ignored (nothing moves), or one carried to outputs the reference leaves alone (an index map
reading the wrong block).

The nudges run as control cases (``runner.session``): the failing suite case's own inputs,
redrawn from its key by the spec's child, with one element (inside the input, off its diagonal)
moved up by NUDGE_BY times that input's rms, through the same candidate and executor children.
Evidence only: a nudge never certifies anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nearmiss.engine.forensics.localise import index_ranges
from nearmiss.engine.models import CaseResult
from nearmiss.engine.runner.arrays import is_float

MAX_NUDGES = 2  # inputs nudged mid-axis per check: one more run of the kernel each
END_MIN_SIZE = 16  # an axis this long has ends worth nudges of their own
MAX_SWAPS = 2  # pairs of like inputs swapped per check: one more run each
# Where the reference stops reading the longest axis (a length mask's bound, a window's edge),
# the element just past it, then the last one read: a kernel reading past a mask, or stopping
# short of it, differs from the reference there and often nowhere a blind nudge lands.
EDGE_SIDES = ("ignored", "used")
SWAP_MATCH = 0.99  # the share of elements the swapped reference must match
NUDGED_CLASSES = ("wrong_values",)  # a crash or a NaN says where it is by itself
# An element moved up by this many times its input's rms: far enough that every dependence the
# reference has shows clearly (a row norm's other elements move by percents), not so far that a
# stable computation overflows.
NUDGE_BY = 8.0
REL = 0.01  # an output moved, beyond its tolerance, by more than this share of its own value
STILL, BETWEEN, MOVED = 0, 1, 2
SIGNIFICANT = 0.1  # the share of the larger footprint a difference must reach


@dataclass(frozen=True)
class Nudge:
    """One planned nudge: ``input`` (the ``position``-th) of ``case`` moved at ``index``."""

    name: str  # the control case run for it
    case: tuple[str, str]  # (suite, name)
    input: str
    position: int
    index: tuple[int, ...]
    by: float = NUDGE_BY
    # At the reference's edge along this axis (``EDGE_SIDES``): the spec's child places the
    # nudge there (``reference_child._edge``) and says where; ``index`` is the rest of it.
    edge: tuple[int, str] | None = None

    def request(self, case: CaseResult) -> dict:
        move = {"input": self.position, "index": list(self.index), "by": self.by}
        if self.edge is not None:
            move["boundary"] = {"axis": self.edge[0], "side": self.edge[1]}
        return _request(self.name, case, move)


@dataclass(frozen=True)
class Swap:
    """Two inputs of ``case`` of one shape and dtype, given to the kernel the other way round:
    if the kernel's outputs on the suite's inputs are the reference's on the swapped ones, the
    kernel takes one for the other (weight for bias, x for y)."""

    name: str
    case: tuple[str, str]
    inputs: tuple[str, str]
    positions: tuple[int, int]

    def request(self, case: CaseResult) -> dict:
        return _request(self.name, case, {"swap": list(self.positions)})


def _request(name: str, case: CaseResult, change: dict) -> dict:
    """The control case asked of the children (``runner.session``): ``case``'s own inputs,
    redrawn by the spec's child, with ``change`` made to them."""
    return {
        "name": name,
        "dims": dict(case.dims),
        "dtype": case.dtype,
        "profile": case.profile,
        "nudge": {"of": [case.suite, case.name], **change},
    }


def _label(case: CaseResult, what: str) -> str:
    """A control case's name (a directory name in the work tree)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{case.name}.{what}")


def swaps(
    cases: Sequence[CaseResult], inputs: Sequence[Sequence[tuple[str, np.ndarray]]]
) -> list[Swap]:
    """The swaps worth asking, for the case the nudges are for: its pairs of float inputs of
    one shape and dtype (the first MAX_SWAPS)."""
    chosen = _nudged_case(cases, inputs)
    if chosen is None:
        return []
    case, arrays = chosen
    floats = [(i, name, x) for i, (name, x) in enumerate(arrays) if is_float(x.dtype)]
    pairs = [
        ((i, a), (j, b))
        for k, (i, a, x) in enumerate(floats)
        for j, b, y in floats[k + 1 :]
        if x.shape == y.shape and x.dtype == y.dtype
    ]
    key = (case.suite, case.name)
    return [
        Swap(_label(case, f"swap-{a}-{b}"), key, (a, b), (i, j))
        for (i, a), (j, b) in pairs[:MAX_SWAPS]
    ]


def swap_sentence(swap: Swap, case: CaseResult, before, after) -> str | None:
    """The sentence when the kernel's outputs (``before``: the suite's run) are the reference's
    on the swapped inputs (``after``: the swap's run), on nearly every element."""
    if before is None or after is None or case.localisation is None:
        return None
    leaf = _leaf(case)
    if leaf >= min(len(before[0]), len(before[1]), len(after[1])):
        return None
    kernel, swapped, reference = before[0][leaf], after[1][leaf], before[1][leaf]
    if kernel.shape != swapped.shape:
        return None
    share = _within(kernel, swapped, case.atol, case.rtol)
    if share < SWAP_MATCH:
        return None
    a, b = swap.inputs
    return (
        f"The kernel's {case.localisation.leaf} is the reference's with {a} and {b} swapped "
        f"({share:.1%} of its elements within tolerance of that, "
        f"{_within(kernel, reference, case.atol, case.rtol):.1%} of the reference as called): "
        f"the kernel takes {a} for {b} and {b} for {a}."
    )


def _within(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close = np.abs(out - ref) <= atol + rtol * np.abs(ref)
    return float(np.mean(close | (np.isnan(out) & np.isnan(ref))))


def _leaf(case: CaseResult) -> int:
    """The output leaf the case localised."""
    assert case.localisation is not None
    return next((i for i, s in enumerate(case.leaves) if s.path == case.localisation.leaf), 0)


def _nudged_case(
    cases: Sequence[CaseResult], inputs: Sequence[Sequence[tuple[str, np.ndarray]]]
) -> tuple[CaseResult, Sequence[tuple[str, np.ndarray]]] | None:
    """The case nudges are for, with its inputs: the first failing case with wrong values —
    none if it has a lead of its own already (a trigger, positions its error follows)."""
    for case, arrays in zip(cases, inputs, strict=True):
        loc = case.localisation
        if case.passed or case.failure_class not in NUDGED_CLASSES or loc is None:
            continue
        if loc.trigger or loc.follows or not arrays:
            return None
        return case, arrays
    return None


def candidates(
    cases: Sequence[CaseResult], inputs: Sequence[Sequence[tuple[str, np.ndarray]]]
) -> list[Nudge]:
    """The nudges worth asking, in order: one per float input of the case they are for (its
    first MAX_NUDGES), each at a different fraction of each axis (a third and two thirds of a
    matrix: off the diagonal, where a transposed block would land on itself); then the input
    with the longest axis again, that axis's index moved to either side of the edge of what the
    reference reads of it (``EDGE_SIDES``; the spec's child finds it, or says there is none),
    then near its end, then near its start (``_at_end``).
    ``inputs``: each case's (name, array) pairs, in the order the kernel takes them."""
    chosen = _nudged_case(cases, inputs)
    if chosen is None:
        return []
    case, arrays = chosen
    key = (case.suite, case.name)
    nudges: list[Nudge] = []
    for position, (name, x) in enumerate(arrays):
        if not is_float(x.dtype) or x.size < 2 or len(nudges) == MAX_NUDGES:
            continue
        index = tuple(size * (i + 1) // (x.ndim + 1) for i, size in enumerate(x.shape))
        nudges.append(Nudge(_label(case, f"nudge-{name}"), key, name, position, index))
    # The ends of the longest axis of all (the sequence a kernel walks): each end nudge is
    # one more kernel run for a case nothing else explained.
    longest = max(nudges, key=lambda n: max(arrays[n.position][1].shape), default=None)
    if longest is None:
        return nudges
    shape = arrays[longest.position][1].shape
    name, position = longest.input, longest.position
    axis = int(np.argmax(shape))
    edges = [
        Nudge(
            _label(case, f"nudge-{name}-edge-{side}"),
            key,
            name,
            position,
            longest.index,
            edge=(axis, side),
        )
        for side in EDGE_SIDES
    ]
    ends = [
        Nudge(_label(case, f"nudge-{name}-{end}"), key, name, position, at)
        for end in ("end", "start")
        if (at := _at_end(longest.index, shape, end)) is not None
    ]
    return nudges + (edges if shape[axis] >= END_MIN_SIZE else []) + ends


def _at_end(index: tuple[int, ...], shape: tuple[int, ...], end: str) -> tuple[int, ...] | None:
    """``index`` with its longest axis's position moved near that axis's ``end`` (an eighth of
    the axis in from it): the first nudges sit mid-axis, and what a kernel gets wrong along a
    long axis often sits at one end — padding past a length (decode's cache) at the end, the
    kv blocks before the last (an accumulator overwritten) at the start. None for an axis
    shorter than END_MIN_SIZE, or where that is the first nudge's position already."""
    axis = int(np.argmax(shape))
    size = shape[axis]
    there = size - 1 - size // 8 if end == "end" else size // 8
    if size < END_MIN_SIZE or there == index[axis]:
        return None
    return index[:axis] + (there,) + index[axis + 1 :]


def classes(before: np.ndarray, after: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Per output, what the nudge did to it: STILL (within the case's tolerance), MOVED (by
    more than REL of its own value besides), or in between — left out of every comparison, so
    a dependence too weak to tell (a product with a near-zero weight) is never a finding. NaN
    appearing or going, or an Inf changing, is MOVED; an unchanged value (an Inf, a NaN left
    as it was) is STILL."""
    before, after = before.astype(np.float64), after.astype(np.float64)
    allowed = atol + rtol * np.abs(before)
    with np.errstate(invalid="ignore"):
        change = np.abs(after - before)
        out = np.where(change <= allowed, STILL, BETWEEN)
        out = np.where(change > allowed + REL * np.abs(before), MOVED, out)
    same = (after == before) | (np.isnan(after) & np.isnan(before))
    out = np.where(same, STILL, out)
    # An infinite tolerance (rtol times an Inf) measures nothing: an Inf that changed moved.
    changed = (np.isnan(after) != np.isnan(before)) | (np.isinf(before) & ~same)
    return np.where(changed, MOVED, out).astype(np.int8)


def where(mask: np.ndarray) -> str:
    """'[1, 4, 0-255]': the indices along each axis where the mask holds."""
    parts = []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        parts.append(index_ranges(np.nonzero(mask.any(axis=others))[0]))
    return f"[{', '.join(parts)}]"


def _axes(mask: np.ndarray) -> list[int]:
    """The axes along which a footprint spans more than one index."""
    return [
        axis
        for axis in range(mask.ndim)
        if mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)).sum() > 1
    ]


def _moves(mask: np.ndarray) -> str:
    count = int(mask.sum())
    return f"{count} {'element' if count == 1 else 'elements'}" + (
        f" ({where(mask)})" if count else ""
    )


def describe(
    nudge: Nudge, kernel: np.ndarray, reference: np.ndarray, leaf: str = "the output"
) -> str | None:
    """One sentence comparing the kernel's footprint with the reference's (``classes`` over
    one output leaf), or None when no output clearly moves in one and stays in the other."""
    ref_only = (reference == MOVED) & (kernel == STILL)
    kernel_only = (kernel == MOVED) & (reference == STILL)
    # A few outputs on the edge of the thresholds (the kernel's values are wrong, so its own
    # threshold differs) are no finding: the difference must be a share of the footprint.
    reached = max(int((reference == MOVED).sum()), int((kernel == MOVED).sum()), 1)
    if max(ref_only.sum(), kernel_only.sum()) < SIGNIFICANT * reached:
        return None
    at = f"{nudge.input}[{', '.join(str(i) for i in nudge.index)}]"
    said = (
        f"Nudging {at} (up by {nudge.by:g} times its rms) moves "
        f"{_moves(reference != STILL)} of {leaf} in the reference and "
        f"{_moves(kernel != STILL)} in the kernel"
    )
    touched = kernel != STILL
    if not touched.any():
        return f"{said}: the kernel ignores {at}, which the reference uses."
    if not kernel_only.any():
        beyond = [a for a in _axes(ref_only) if a not in _axes(touched)]
        if beyond:
            axes = " and ".join(str(a) for a in beyond)
            return (
                f"{said}: the reference carries {at} along output axis {axes} and the kernel "
                "does not — a reduction over that axis missing or cut short."
            )
        return f"{said}: the kernel leaves out {where(ref_only)}, which the reference moves."
    if not ref_only.any():
        return (
            f"{said}: the kernel carries {at} to {where(kernel_only)}, which the reference "
            "leaves alone."
        )
    return (
        f"{said}: the kernel carries {at} to {where(kernel_only)} and not to "
        f"{where(ref_only)}, where the reference does."
    )


def _leaves(raw: Any) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """A run case's (outputs, reference) leaves (``runner.session.RawCase``), None if it has
    no outputs to compare."""
    if raw is None or raw.outputs is None or not raw.reference:
        return None
    return raw.outputs, raw.reference


class NudgePlan:
    """The nudges of one check, asked one per control round (``runner.session``): the next
    only while those before found nothing, so a check pays for one run of the kernel when the
    first nudge names the fault. The swaps go with the first."""

    def __init__(self, cases: Sequence[CaseResult], raws: Sequence[Any]):
        self.cases: dict[tuple[str, str], CaseResult] = {(c.suite, c.name): c for c in cases}
        self.base = {(r.info.suite, r.info.name): _leaves(r) for r in raws}
        inputs = [r.input_arrays for r in raws]
        self.waiting: list[Nudge] = candidates(cases, inputs)
        self.swaps = swaps(cases, inputs)
        self.asked: list[Nudge | Swap] = []
        self.found: dict[str, str | None] = {}  # name -> its sentence, once judged

    def next(self, ran: Mapping[str, Any]) -> list[dict]:
        """The control case(s) to ask in this round, given the control runs so far."""
        self._judge(ran)
        # An edge nudge the spec's child could not place (the reference reads every position,
        # or no single run of them): its twin would ask the same of the same axis in vain.
        unplaced = {
            item.input
            for item in self.asked
            if isinstance(item, Nudge) and item.edge and item.name in ran
            if not getattr(ran[item.name], "nudged", None)
        }
        self.waiting = [n for n in self.waiting if not (n.edge and n.input in unplaced)]
        if any(self.found.values()) or not self.waiting:
            return []
        asked: list[Nudge | Swap] = [self.waiting.pop(0)]
        if not self.asked:
            asked += self.swaps
        self.asked += asked
        return [item.request(self.cases[item.case]) for item in asked]

    def _judge(self, ran: Mapping[str, Any]) -> None:
        for item in self.asked:
            if item.name in self.found or item.name not in ran:
                continue
            case = self.cases[item.case]
            before, after = self.base.get(item.case), _leaves(ran[item.name])
            if isinstance(item, Swap):
                self.found[item.name] = swap_sentence(item, case, before, after)
            else:
                self.found[item.name] = _compare(item, case, before, after, ran[item.name])

    def conclude(self, cases: Sequence[CaseResult], ran: Mapping[str, Any]) -> None:
        """Add the findings to their case: ``localisation.reach`` and the diagnosis."""
        self._judge(ran)
        for case in cases:
            said = [
                self.found[n.name]
                for n in self.asked
                if n.case == (case.suite, case.name) and self.found.get(n.name)
            ]
            if said and case.localisation is not None:
                case.localisation.reach = " ".join(s for s in said if s)
                case.diagnosis = f"{case.diagnosis} {case.localisation.reach}"


def _compare(nudge: Nudge, case: CaseResult, before, after, raw: Any) -> str | None:
    """The sentence for one nudge, compared on the output leaf the case localised; a nudge at
    the reference's edge only where the spec's child placed it (``raw.nudged``), said first."""
    if before is None or after is None or case.localisation is None:
        return None
    edge = ""
    if nudge.edge is not None:
        told = getattr(raw, "nudged", None) or {}
        if len(told.get("index", ())) != len(nudge.index):
            return None
        nudge = replace(nudge, index=tuple(told["index"]))
        assert nudge.edge is not None  # replace() kept it
        edge = (
            f"The edge of what the reference reads of {nudge.input} along axis "
            f"{nudge.edge[0]}: position {told['used']} is read, {told['ignored']} is not. "
        )
    leaf = _leaf(case)
    if leaf >= min(len(before[0]), len(after[0]), len(after[1])):
        return None
    kernel = classes(before[0][leaf], after[0][leaf], case.atol, case.rtol)
    reference = classes(before[1][leaf], after[1][leaf], case.atol, case.rtol)
    if kernel.shape != reference.shape:
        return None
    said = describe(nudge, kernel, reference, case.localisation.leaf)
    return edge + said if said else None
