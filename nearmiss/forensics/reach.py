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
redrawn from its key by the spec's child, with one element — the middle of the input — moved by
that input's rms, through the same candidate and executor children. Evidence only: a nudge
never certifies anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nearmiss.forensics.localise import index_ranges
from nearmiss.models import CaseResult
from nearmiss.runner.arrays import is_float

MAX_NUDGES = 2  # inputs nudged per check: one more run of the kernel each
NUDGED_CLASSES = ("wrong_values",)  # a crash or a NaN says where it is by itself


@dataclass(frozen=True)
class Nudge:
    """One planned nudge: ``input`` (the ``position``-th) of ``case`` moved at ``index``."""

    name: str  # the control case run for it
    case: tuple[str, str]  # (suite, name)
    input: str
    position: int
    index: tuple[int, ...]

    def request(self, case: CaseResult) -> dict:
        """The control case asked of the children (``runner.session``)."""
        return {
            "name": self.name,
            "dims": dict(case.dims),
            "dtype": case.dtype,
            "profile": case.profile,
            "nudge": {"of": list(self.case), "input": self.position, "index": list(self.index)},
        }


def plan(cases: Sequence[CaseResult], inputs: Sequence[Sequence[tuple[str, np.ndarray]]]):
    """The nudges of one check: the first failing case with wrong values and no lead of its
    own gets one per float input (its first MAX_NUDGES), each at the input's middle element.
    ``inputs``: each case's (name, array) pairs, in the order the kernel takes them."""
    for case, arrays in zip(cases, inputs, strict=True):
        loc = case.localisation
        if case.passed or case.failure_class not in NUDGED_CLASSES or loc is None:
            continue
        if loc.trigger or loc.follows or not arrays:
            return []
        nudges = []
        for position, (name, x) in enumerate(arrays):
            if not is_float(x.dtype) or x.size < 2 or len(nudges) == MAX_NUDGES:
                continue
            index = tuple(size // 2 for size in x.shape)
            label = f"{case.name}.nudge-{name}"
            nudges.append(Nudge(label, (case.suite, case.name), name, position, index))
        return nudges
    return []


def moved(before: np.ndarray, after: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """The outputs a nudge moved beyond the case's tolerance (NaN appearing or going counts)."""
    before, after = before.astype(np.float64), after.astype(np.float64)
    with np.errstate(invalid="ignore"):
        beyond = np.abs(after - before) > atol + rtol * np.abs(before)
    return beyond | (np.isnan(after) != np.isnan(before))


def where(mask: np.ndarray) -> str:
    """'[1, 4, 0-255]': the indices along each axis where anything moved."""
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


def describe(
    nudge: Nudge, kernel: np.ndarray, reference: np.ndarray, leaf: str = "the output"
) -> str | None:
    """One sentence comparing the two footprints (boolean masks over one output leaf), or
    None when they are the same: then this nudge explains nothing."""
    if np.array_equal(kernel, reference):
        return None
    at = f"{nudge.input}[{', '.join(str(i) for i in nudge.index)}]"
    ref_n, ker_n = int(reference.sum()), int(kernel.sum())
    said = (
        f"Nudging {at} moves {ref_n} elements of {leaf} in the reference"
        + (f" ({where(reference)})" if ref_n else "")
        + f" and {ker_n} in the kernel"
        + (f" ({where(kernel)})" if ker_n else "")
    )
    only_ref = [a for a in _axes(reference) if a not in _axes(kernel)]
    if ref_n and not ker_n:
        return f"{said}: the kernel ignores {at}, which the reference uses."
    if only_ref and not (kernel & ~reference).any():
        axes = " and ".join(str(a) for a in only_ref)
        return (
            f"{said}: the reference carries {at} along output axis {axes} and the kernel does "
            "not — a reduction over that axis missing or cut short."
        )
    if not (reference & ~kernel).any():
        return f"{said}: the kernel carries {at} to outputs the reference leaves alone."
    return f"{said}: the kernel carries {at} to other outputs than the reference does."


def conclude(
    nudges: Sequence[Nudge],
    cases: Sequence[CaseResult],
    base: Mapping[tuple[str, str], tuple[list[np.ndarray], list[np.ndarray]]],
    ran: Mapping[str, tuple[list[np.ndarray], list[np.ndarray]] | None],
) -> None:
    """Add the nudges' findings to their case (``localisation.reach`` and the diagnosis).

    ``base``: the nudged case's (outputs, reference) leaves; ``ran``: each nudge's, by name, or
    None where it did not run. Compared on the leaf the case localised."""
    for case in cases:
        mine = [n for n in nudges if n.case == (case.suite, case.name)]
        if not mine or case.localisation is None or (case.suite, case.name) not in base:
            continue
        outputs, reference = base[(case.suite, case.name)]
        leaf = next((i for i, s in enumerate(case.leaves) if s.path == case.localisation.leaf), 0)
        found = []
        for nudge in mine:
            after = ran.get(nudge.name)
            if after is None or leaf >= min(len(after[0]), len(after[1]), len(outputs)):
                continue
            kernel = moved(outputs[leaf], after[0][leaf], case.atol, case.rtol)
            ref = moved(reference[leaf], after[1][leaf], case.atol, case.rtol)
            if kernel.shape != ref.shape:
                continue
            sentence = describe(nudge, kernel, ref, case.localisation.leaf)
            if sentence:
                found.append(sentence)
        if found:
            case.localisation.reach = " ".join(found)
            case.diagnosis = f"{case.diagnosis} {case.localisation.reach}"
