"""Which cases one run covers: a whole suite, one named case, or a custom case.

A custom case (an experiment of the fix agent) may only vary what the spec's own suites vary:
its dimension names, the dtypes it tests or gives a tolerance for, and its value profiles —
``make_inputs`` was written for those and nothing else. Runs inside the spec's sandbox child
(the spec is only ever loaded there); a request it cannot satisfy raises ``SelectionError`` with
what is allowed, so the agent can correct itself.
"""

from __future__ import annotations

from typing import Any

from nearmiss.engine.spec import DTYPES, NORMAL_PROFILE, Case, OpSpec, SpecError

CUSTOM = "custom"  # suite label and case name of a custom case
# A custom dimension may exceed the largest the suites use by this factor: an experiment should
# not be able to ask for a run far bigger than the spec's author sized the suites for.
MAX_DIM_FACTOR = 8


class SelectionError(SpecError):
    """A case request the spec does not allow; the message lists what it does allow."""


def _suites(spec: OpSpec) -> list[tuple[str, Case]]:
    return [(suite, case) for suite in ("compact", "extended") for case in spec.suite(suite)]


def allowed(spec: OpSpec) -> dict[str, Any]:
    """What a request may name or vary: cases, dimension names and ceilings, dtypes, profiles."""
    cases = _suites(spec)
    ceilings: dict[str, int] = {}
    for _, case in cases:
        for dim, value in case.dims.items():
            ceilings[dim] = max(ceilings.get(dim, 0), value * MAX_DIM_FACTOR)
    dtypes = {case.dtype for _, case in cases} | set(spec.tolerance)
    return {
        "cases": [f"{case.name} ({suite})" for suite, case in cases],
        "dims": ceilings,
        "dtypes": [d for d in DTYPES if d in dtypes],
        "profiles": sorted({NORMAL_PROFILE} | {case.profile for _, case in cases}),
    }


def _named(spec: OpSpec, name: str) -> tuple[str, Case]:
    """The case ``name`` names: ``ragged``, or ``extended/ragged`` as evidence shows it."""
    wanted_suite, slash, wanted = name.rpartition("/")
    for suite, case in _suites(spec):
        if case.name == name or (slash and suite == wanted_suite and case.name == wanted):
            return suite, case
    raise SelectionError(f"unknown case {name!r}; cases: {', '.join(allowed(spec)['cases'])}")


def _custom(spec: OpSpec, base: Case, select: dict[str, Any]) -> Case:
    rules = allowed(spec)
    dims = dict(base.dims)
    for dim, value in (select.get("dims") or {}).items():
        if dim not in rules["dims"]:
            raise SelectionError(
                f"unknown dimension {dim!r}; this spec's dimensions are {', '.join(rules['dims'])}"
            )
        ceiling = rules["dims"][dim]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
            raise SelectionError(
                f"dimension {dim}={value!r} must be an integer in 1..{ceiling} "
                f"({MAX_DIM_FACTOR}× the largest the suites use)"
            )
        dims[dim] = value
    dtype = select.get("dtype") or base.dtype
    if dtype not in rules["dtypes"]:
        raise SelectionError(
            f"dtype {dtype!r} is not one this spec tests; allowed: {', '.join(rules['dtypes'])}"
        )
    profile = select.get("profile") or base.profile
    if profile not in rules["profiles"]:
        raise SelectionError(
            f"value profile {profile!r} is unknown to this spec; "
            f"allowed: {', '.join(rules['profiles'])}"
        )
    return Case(CUSTOM, dims, dtype=dtype, profile=profile)


def select_cases(spec: OpSpec, suite: str, select: dict[str, Any] | None) -> list[tuple[str, Case]]:
    """(suite label, case) pairs of one run.

    ``select`` is None for whole suites, else {"case": name or None, "dims": {...} or None,
    "dtype": ..., "profile": ...}: the named case (default: the first compact one), varied by
    whatever else is given. A variation that changes nothing is the named case itself.
    """
    if select is None:
        return [(s, c) for s, c in _suites(spec) if suite in ("all", s)]
    name = select.get("case") or spec.compact[0].name
    label, base = _named(spec, name)
    case = _custom(spec, base, select)
    if (case.dims, case.dtype, case.profile) == (base.dims, base.dtype, base.profile):
        return [(label, base)]
    return [(CUSTOM, case)]
