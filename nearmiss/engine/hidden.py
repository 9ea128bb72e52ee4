"""Hidden cases: inputs the spec allows but does not list, drawn by the engine for each check.

A certificate says a kernel is right for every input its spec allows, not only on the cases the
spec lists: a kernel keyed on the listed sizes (right for 64 and 45 rows, wrong for 128) or on
the listed value range (right while |x| < 400, where the largest profile reaches about 135)
passes every listed case. So every certifying check (suite ``all``) also runs cases drawn from
its seed (the same ``--seed`` draws the same ones), reported under the suite ``hidden`` and
never shown to a fixer before the verdict:

- ``larger`` and ``unlisted``: a listed case each, with its dimensions drawn anew, as many as
  the size budget holds, in a random order, from the sizes no case lists — above the listed
  sizes for ``larger`` (more blocks: where an accumulator reset or a bound that holds for two
  blocks shows), any of them for ``unlisted`` (between the listed sizes too: a kernel keyed on
  them, or wrong on a band) — and a fresh key;
- ``values-xN``: a listed case (half the time one with an adversarial profile, where the spec
  has one: the profiles that stretch the values) with a fresh key and its signal-like float
  inputs — both signs and more than two distinct values, so not masks, probabilities, scales
  or lengths — multiplied by N, a power of two. That is exact in floating point, so a kernel's
  linear work scales exactly, and its absolute tolerance grows with the reference's magnitude
  (never shrinks). Where the spec's own reference turns non-finite at a scale, a smaller one is
  tried: the reference is the truth, and it must hold at the scale asked.

Every hidden case's tolerance also holds ``NOISE_MARGIN`` times the reference's own float noise
on its inputs (its result against the same computation in float64), as ``spec check`` asks of a
listed case's: at larger sizes and magnitudes the reference itself rounds more.

A dimension's domain is the spec's (``OpSpec.domains``), else what its listed values imply: from
the smallest listed value to ``GROWTH`` times the largest, in steps of the largest power of two
dividing their differences (5 and 7: odd sizes; a dimension every case sets to one value stays
there). A hidden case holds at
most ``GROWTH`` times the elements of the largest listed case. Drawing is plain Python over the
spec's declarations (``draw``); the spec's child makes the inputs and references.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Final

from nearmiss.engine.spec import Case, Dim, OpSpec

HIDDEN_SUITE: Final = "hidden"
# The sizes cases: past the listed sizes, and among all those no case lists.
LARGER = "larger"
UNLISTED = "unlisted"
DEFAULT_SCALES = (4.0, 8.0, 16.0)
NO_SIZE_TO_DRAW = "the spec's cases leave no size to draw hidden cases from"
GROWTH = 2


@dataclass(frozen=True)
class HiddenCase:
    """One drawn case: what to draw its inputs as (``case``), and the factors its signal-like
    float inputs are scaled by after: the first, else the next where the spec's reference
    turns non-finite (``(1.0,)``: none)."""

    case: Case
    scales: tuple[float, ...]


def _spacing(values: set[int]) -> int:
    """The largest power of two dividing every difference between the values: they all lie on
    one grid of that step (256 and 320: 64; 5 and 7, odd sizes: 2; 45 and 64: 1)."""
    low = min(values)
    step = 1
    while all((v - low) % (step * 2) == 0 for v in values):
        step *= 2
    return step


def domains(spec: OpSpec) -> dict[str, Dim]:
    """Each dimension's domain: declared, else implied by the listed cases."""
    found = {}
    for dim, values in _listed_values(spec).items():
        if dim in spec.domains:
            found[dim] = spec.domains[dim]
        elif len(values) == 1:
            (value,) = values
            found[dim] = Dim(min=value, max=value)
        else:
            step = _spacing(values)
            found[dim] = Dim(min=min(values), max=GROWTH * max(values), step=step)
    return found


def describe(domain: Dim) -> str:
    """'45..128', '256..640 step 64', '5..13 step 2', '128' (one value), '8..any step 8'."""
    step = domain.step or domain.multiple_of
    every = f" step {step}" if step > 1 else ""
    if domain.max is None:
        return f"{domain.values(domain.min + 2 * step)[0]}..any{every}"
    values = domain.values(domain.max)
    if len(values) <= 1:
        return str(values[0]) if len(values) else "none"
    return f"{values[0]}..{values[-1]}{every}"


def narrow(spec: OpSpec) -> list[str]:
    """Why the spec leaves the hidden cases little to draw: the dims whose domain holds no value
    beyond the listed ones, when every dim is so, and no value scale."""
    notes = []
    listed = _listed_values(spec)
    limit = GROWTH * max(_size(c) for c in (*spec.compact, *spec.extended))
    fixed = [
        dim for dim, domain in domains(spec).items() if set(domain.values(limit)) <= listed[dim]
    ]
    if fixed and len(fixed) == len(listed):
        notes.append(
            f"{NO_SIZE_TO_DRAW} ({', '.join(fixed)} "
            "take only the listed values): declare OpSpec(domains={...}) with the sizes the "
            "kernel must handle"
        )
    if spec.value_scales == ():
        notes.append(
            "the spec allows no value scale (value_scales=()): hidden cases keep the "
            "listed value profiles"
        )
    return notes


def _listed_values(spec: OpSpec) -> dict[str, set[int]]:
    values: dict[str, set[int]] = {}
    for case in (*spec.compact, *spec.extended):
        for dim, value in case.dims.items():
            values.setdefault(dim, set()).add(value)
    return values


def _size(case: Case) -> int:
    return math.prod(case.dims.values()) if case.dims else 1


def _draw_dims(
    rng: random.Random,
    base: Case,
    found: dict[str, Dim],
    listed: dict[str, set[int]],
    limit: int,
    larger: bool,
) -> dict[str, int]:
    """The base case's dims, as many as fit in ``limit`` elements drawn anew, taken in a random
    order, each from its domain's values no case lists: with ``larger``, those above every
    listed one where there are some (more blocks, longer loops: where an accumulator reset or
    a bound that holds for two blocks shows); else any of them, between the listed ones too (a
    kernel keyed on the listed sizes, or wrong on a band of them). A dim whose draw would pass
    the limit keeps its value (a few tries each)."""
    choices = {}
    for dim in base.dims:
        values = found[dim].values(limit)
        unlisted = [v for v in values if v not in listed[dim]]
        above = [v for v in unlisted if v > max(listed[dim])]
        if unlisted:
            choices[dim] = (above or unlisted) if larger else unlisted
    dims = dict(base.dims)
    for dim in rng.sample(sorted(choices), len(choices)):
        for _ in range(8):
            value = rng.choice(choices[dim])
            if math.prod({**dims, dim: value}.values()) <= limit:
                dims[dim] = value
                break
    return dims


def draw(spec: OpSpec, seed: int) -> list[HiddenCase]:
    """The hidden cases of a check with ``seed``: a function of the spec's declarations and
    the seed alone."""
    rng = random.Random(f"nearmiss-hidden-{seed}")
    listed = [*spec.compact, *spec.extended]
    limit = GROWTH * max(_size(c) for c in listed)
    drawn: list[HiddenCase] = []
    for name, larger in ((LARGER, True), (UNLISTED, False)):
        base = rng.choice(listed)
        dims = _draw_dims(rng, base, domains(spec), _listed_values(spec), limit, larger)
        if all(dims != h.case.dims for h in drawn):  # the same sizes twice say nothing more
            drawn.append(HiddenCase(Case(name, dims, base.dtype, base.profile), (1.0,)))
    scales = DEFAULT_SCALES if spec.value_scales is None else spec.value_scales
    if scales:
        # Half the time an adversarial profile's case, scaled past every listed magnitude; else
        # any case, whose values land between the listed profiles' too.
        stretched = [c for c in listed if c.adversarial]
        base = rng.choice(stretched if stretched and rng.random() < 0.5 else listed)
        scale = rng.choice(sorted(scales))
        smaller = tuple(sorted((s for s in scales if s < scale), reverse=True))
        name = f"values-x{scale:g}"
        drawn.append(HiddenCase(Case(name, base.dims, base.dtype, base.profile), (scale, *smaller)))
    return drawn


def _floats(np: Any, value: Any) -> Any:
    """The value as a float64 array where it is a float type (bfloat16 included), else None."""
    array = np.asarray(value)
    if array.dtype.kind not in "fc" and "float" not in str(array.dtype):
        return None
    return array.astype(np.float64)


def scalable(np: Any, value: Any) -> bool:
    """A signal-like float input: both signs and more than two distinct values (not a mask, a
    probability, a scale or a length, whose meaning a factor would change)."""
    wide = _floats(np, value)
    if wide is None:
        return False
    finite = wide[np.isfinite(wide)]
    return bool(finite.size and finite.min() < 0 < finite.max() and np.unique(finite).size > 2)


def magnitude(np: Any, leaves: list[Any]) -> float:
    """The largest finite magnitude among float leaves (0 where there is none)."""
    top = 0.0
    for leaf in leaves:
        wide = _floats(np, leaf)
        finite = np.abs(wide[np.isfinite(wide)]) if wide is not None else wide
        if finite is not None and finite.size:
            top = max(top, float(finite.max()))
    return top


def finite_where(np: Any, leaves: list[Any], like: list[Any]) -> bool:
    """Whether ``leaves`` are finite wherever ``like`` (the unscaled reference) is."""
    for leaf, base in zip(leaves, like, strict=True):
        wide, reference = _floats(np, leaf), _floats(np, base)
        if wide is None or reference is None:
            continue
        if wide.shape != reference.shape or bool(
            (np.isfinite(reference) & ~np.isfinite(wide)).any()
        ):
            return False
    return True


def listed(cases: list[Any]) -> list[Any]:
    """The spec's own cases of a report (``CaseResult``), without the hidden ones."""
    return [c for c in cases if c.suite != HIDDEN_SUITE]


def noise_used(np: Any, leaves: list[Any], truth: list[Any], atol: float, rtol: float) -> float:
    """The most of the tolerance ``atol + rtol·|truth|`` the float leaves' distance from
    ``truth`` (the same computation in float64) uses, where both are finite."""
    used = 0.0
    for leaf, exact in zip(leaves, truth, strict=True):
        value, wide = _floats(np, leaf), _floats(np, exact)
        if value is None or wide is None or value.shape != wide.shape:
            continue
        finite = np.isfinite(value) & np.isfinite(wide)
        if finite.any():
            error = np.abs(value[finite] - wide[finite])
            used = max(used, float((error / (atol + rtol * np.abs(wide[finite]))).max()))
    return used
