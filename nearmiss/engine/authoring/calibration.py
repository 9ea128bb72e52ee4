"""``nearmiss spec check``: is each case's tolerance right for the reference's own noise?

A tolerance is a claim about two numbers. It must be *looser* than the noise a correct kernel
may show — at the least, the difference between the reference at the case's precision and the
same computation in float64 (a kernel that sums in another order differs by about that much) —
or correct kernels fail, intermittently, with a fresh seed each run. And it must be *tighter*
than what a precision bug produces — the same computation done in bfloat16 — or a kernel that
accumulates in bfloat16 is certified. The spec's child computes the three versions
(``runner.spec_noise``); this module judges them and says what to write instead.

Figures are fractions of the tolerance: ``used = max |a - b| / (atol + rtol·|reference|)``, the
quantity a check compares with 1. Suggestions use one number for both atol and rtol.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, cast

import numpy as np
from pydantic import BaseModel

from nearmiss.engine.errors import UsageError
from nearmiss.engine.forensics.compare import tolerance_used as leaf_tolerance_used
from nearmiss.engine.runner.arrays import float_eps, is_float, load_arrays, restore_dtype
from nearmiss.engine.runner.sandbox import ChildFailure, Limits
from nearmiss.engine.runner.scratch import remove_tree, scratch_dir
from nearmiss.engine.runner.spec_sandbox import spec_request, start_spec_child
from nearmiss.engine.spec import NOISE_MARGIN

# ... and fail a bfloat16 computation by at least this factor.
BUG_MARGIN = 2.0
# A case whose noise uses more than this fraction of its tolerance may fail with a fresh seed.
TIGHT_FRACTION = 0.5

Verdict = Literal["ok", "tight", "too_tight", "loose", "uncalibrated"]
# Worst first: what the summary line and the exit status report.
_SEVERITY: tuple[str, ...] = ("too_tight", "loose", "uncalibrated", "tight", "ok")
PROBLEMS = frozenset({"too_tight", "loose"})


class CaseNoise(BaseModel):
    suite: str
    name: str
    dims: dict[str, int] = {}
    dtype: str
    profile: str
    atol: float
    rtol: float
    verdict: Verdict
    # The reference at the case's precision against the same computation in float64.
    noise_used: float | None = None
    noise_max_abs: float | None = None
    noise_scaled: float | None = None  # max |ref - truth| / (1 + |ref|)
    # Half the spacing of 1.0 in the narrowest float output: any kernel rounds its result.
    output_rounding: float = 0.0
    # The same computation in bfloat16 against the reference (None: not wider than bfloat16).
    narrow_used: float | None = None
    narrow_scaled: float | None = None
    # The reference with every float32 dot one bfloat16 pass (a TPU at DEFAULT precision)
    # against float64: how much of the tolerance that uses (None: no float32 dot).
    chip_used: float | None = None
    chip_max_abs: float | None = None
    reference_s: float = 0.0
    note: str = ""
    # Each small constant of the reference (an eps) and how much of the tolerance the same
    # computation without it uses: at most 1, and this case cannot tell it from 0.
    constants: list[tuple[float, float]] = []
    # The reference's output dtypes, and its largest finite output magnitude.
    outputs: list[str] = []
    output_max_abs: float = 0.0
    # Steps that round a float to an integer value (a quantised reference): those whose result
    # the float64 run keeps from the reference's own precision, and those inside a loop or a
    # branch, where it cannot (their flipped roundings show as noise).
    rounding_steps: int = 0
    rounding_in_loops: int = 0

    @property
    def integer_outputs(self) -> bool:
        """Every output is an integer or boolean array: a correct kernel matches exactly."""
        return bool(self.outputs) and not any(is_float(d) for d in _dtypes(self))

    @property
    def exact(self) -> bool:
        """The reference agrees with its float64 run exactly: no rounding noise at all."""
        return self.noise_max_abs == 0.0


def _dtypes(case: CaseNoise) -> list[np.dtype]:
    return [restore_dtype(name) for name in case.outputs]


class DtypeAdvice(BaseModel):
    """One tolerance (atol = rtol) per dtype that every case of that dtype accepts."""

    dtype: str
    declared: tuple[float, float]
    at_least: float  # NOISE_MARGIN x the largest noise seen
    at_most: float | None = None  # the bfloat16 run fails by BUG_MARGIN below this
    # Why: "integer" (every output an integer: exact, atol = rtol = 0), "exact" (the reference
    # agrees with its float64 run on every case: only its outputs' own rounding), "noise".
    basis: Literal["integer", "exact", "noise"] = "noise"
    # The largest error the declared tolerance admits on an integer output (0: none).
    integer_slack: float = 0.0


class SpecNoise(BaseModel):
    spec: str
    seed: int
    suite: str
    cases: list[CaseNoise]
    advice: list[DtypeAdvice]
    # Where a certifying check draws its hidden cases (nearmiss.engine.hidden): each dim's
    # domain, and what the spec leaves too narrow or cannot serve at this seed.
    domains: dict[str, str] = {}
    hidden_notes: list[str] = []

    @property
    def verdict(self) -> str:
        found = {case.verdict for case in self.cases}
        return next((v for v in _SEVERITY if v in found), "ok")

    @property
    def problems(self) -> list[CaseNoise]:
        return [case for case in self.cases if case.verdict in PROBLEMS]

    @property
    def droppable(self) -> list[tuple[float, float]]:
        """(constant, the most of a tolerance its absence uses) for each small constant of the
        reference that no case can tell from 0: a kernel that leaves it out certifies."""
        worst: dict[float, float] = {}
        for case in self.cases:
            for value, used in case.constants:
                worst[value] = max(worst.get(value, 0.0), used)
        return [(value, used) for value, used in sorted(worst.items()) if used <= 1.0]

    @property
    def fixed_dims(self) -> dict[str, int]:
        """The dims every case sets to one same value: no case can tell a kernel right only at
        that size (a hard-coded length, two same-shaped arguments swapped) from a right one."""
        values: dict[str, set[int]] = {}
        for case in self.cases:
            for dim, value in case.dims.items():
                values.setdefault(dim, set()).add(value)
        return {dim: next(iter(v)) for dim, v in values.items() if len(v) == 1}


def _finite_errors(
    value: np.ndarray, reference: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """(|value - reference|, reference) where the reference is finite; None when the value is
    not finite somewhere the reference is (infinitely far, whatever the tolerance)."""
    r, v = reference.astype(np.float64), value.astype(np.float64)
    finite = np.isfinite(r)
    if not np.isfinite(v[finite]).all():
        return None
    return np.abs(v[finite] - r[finite]), r[finite]


def tolerance_used(value: np.ndarray, reference: np.ndarray, atol: float, rtol: float) -> float:
    """The check's own ratio (``forensics.compare.tolerance_used``) of ``value`` against
    ``reference``; infinite where a non-finite value meets a finite reference."""
    errors = _finite_errors(value, reference)
    if errors is None:
        return math.inf
    used = leaf_tolerance_used(*errors, atol, rtol)
    return math.inf if used is None else used


def scaled_error(value: np.ndarray, reference: np.ndarray) -> float:
    """max |value - reference| / (1 + |reference|): the atol = rtol that would just pass."""
    errors = _finite_errors(value, reference)
    if errors is None:
        return math.inf
    error, ref = errors
    return float((error / (1.0 + np.abs(ref))).max()) if error.size else 0.0


def _float_pairs(values, references):
    return [(v, r) for v, r in zip(values, references, strict=True) if is_float(r.dtype)]


def judge_case(
    references: list[np.ndarray],
    truths: list[np.ndarray] | None,
    narrows: list[np.ndarray] | None,
    atol: float,
    rtol: float,
    rounding_in_loops: int = 0,
) -> dict:
    """The figures and verdict of one case (see the module docstring). ``rounding_in_loops``:
    steps rounding a float to an integer that the float64 run recomputed (inside a loop or a
    branch); a difference beyond the tolerance is then flipped roundings, not noise."""
    figures: dict = {}
    floats = [r for r in references if is_float(r.dtype)]
    figures["output_rounding"] = max((float_eps(r.dtype) / 2 for r in floats), default=0.0)
    if truths is not None:
        pairs = _float_pairs(truths, references)
        figures["noise_used"] = max((tolerance_used(t, r, atol, rtol) for t, r in pairs), default=0)
        figures["noise_scaled"] = max((scaled_error(t, r) for t, r in pairs), default=0.0)
        figures["noise_max_abs"] = max(
            (
                float(np.nanmax(np.abs(t.astype(np.float64) - r.astype(np.float64))))
                for t, r in pairs
                if r.size
            ),
            default=0.0,
        )
    if narrows is not None:
        pairs = _float_pairs(narrows, references)
        if any(not np.array_equal(n, r) for n, r in pairs):
            figures["narrow_used"] = max(tolerance_used(n, r, atol, rtol) for n, r in pairs)
            figures["narrow_scaled"] = max(scaled_error(n, r) for n, r in pairs)
    if truths is None:
        verdict = "uncalibrated"
    elif figures["noise_used"] > 1 and rounding_in_loops:
        # Roundings the float64 run could not keep flipped on a boundary: no measure of noise.
        verdict = "uncalibrated"
    elif figures["noise_used"] > 1:
        verdict = "too_tight"
    elif figures.get("narrow_used") is not None and figures["narrow_used"] <= 1:
        verdict = "loose"
    elif figures["noise_used"] > TIGHT_FRACTION:
        verdict = "tight"
    else:
        verdict = "ok"
    return {"verdict": verdict, **figures}


def _round_up(value: float) -> float:
    """One significant figure, rounded up (3.2e-6 -> 4e-6)."""
    if value <= 0 or not math.isfinite(value):
        return value
    exponent = math.floor(math.log10(value))
    return math.ceil(value / 10**exponent - 1e-9) * 10**exponent


def _round_down(value: float) -> float:
    if value <= 0 or not math.isfinite(value):
        return value
    exponent = math.floor(math.log10(value))
    return max(math.floor(value / 10**exponent + 1e-9), 1) * 10**exponent


def advise(cases: list[CaseNoise]) -> list[DtypeAdvice]:
    """Per dtype: the range of atol = rtol that passes the noise and fails the bfloat16 run."""
    advice = []
    for dtype in sorted({case.dtype for case in cases}):
        # A case whose float64 run rounded to integers differently (inside a loop) measured no
        # noise: it suggests nothing.
        mine = [
            c
            for c in cases
            if c.dtype == dtype
            and c.noise_scaled is not None
            and not (c.rounding_in_loops and c.verdict == "uncalibrated")
        ]
        if not mine:
            continue
        # ``mine`` keeps only the cases with a noise_scaled.
        atol, rtol = mine[0].atol, mine[0].rtol
        if all(c.integer_outputs for c in mine):
            # Integers: a correct kernel matches exactly, and any tolerance is slack.
            largest = max(c.output_max_abs for c in mine)
            slack = math.floor(atol + rtol * largest) if atol or rtol else 0.0
            advice.append(
                DtypeAdvice(
                    dtype=dtype,
                    declared=(atol, rtol),
                    at_least=0.0,
                    basis="integer",
                    integer_slack=float(slack),
                )
            )
            continue
        noise = max(max(cast(float, c.noise_scaled), c.output_rounding) for c in mine)
        at_least = _round_up(NOISE_MARGIN * noise)
        narrows = [c.narrow_scaled for c in mine if c.narrow_scaled is not None]
        at_most = _round_down(min(narrows) / BUG_MARGIN) if narrows else None
        advice.append(
            DtypeAdvice(
                dtype=dtype,
                declared=(atol, rtol),
                at_least=at_least,
                at_most=at_most,
                basis="exact" if all(c.exact for c in mine) else "noise",
            )
        )
    return advice


def _load(case_dir: Path, name: str) -> list[np.ndarray] | None:
    path = case_dir / name
    return load_arrays(path)[0] if path.is_file() else None


def measure(spec: Path, suite: str, seed: int, limits: Limits | None = None) -> SpecNoise:
    """Run the spec's reference on every case of ``suite`` in its sandboxed child and judge
    each case's tolerance. UsageError (one line) for a spec that does not load or run."""
    limits = limits or Limits()
    workdir = scratch_dir("nearmiss-calibrate-")
    child = None
    try:
        child = start_spec_child(workdir, limits, "cpu")
        child.send(cmd="calibrate", seed=seed, suite=suite, **spec_request(workdir, spec.resolve()))
        name, cases, described = "", [], {}
        while True:
            try:
                message = child.receive(limits.reference_timeout_s)
            except ChildFailure as exc:
                raise UsageError(f"the spec's child failed: {exc}") from exc
            event = message.get("event")
            if event == "spec_error":
                raise UsageError(str(message.get("message", "the spec does not run")))
            if event == "spec":
                name = str(message["name"])
                described = message
            elif event == "case_noise":
                cases.append(_case(message))
            elif event == "done":
                break
            else:
                raise UsageError(f"unexpected message from the spec's child: {event}")
        return SpecNoise(
            spec=name,
            seed=seed,
            suite=suite,
            cases=cases,
            advice=advise(cases),
            domains={str(k): str(v) for k, v in (described.get("domains") or {}).items()},
            hidden_notes=[str(n) for n in described.get("hidden_notes") or []],
        )
    finally:
        if child is not None:
            child.kill()
            child.close()
        remove_tree(workdir)


def _case(message: dict) -> CaseNoise:
    case_dir = Path(message["dir"])
    atol, rtol = (float(v) for v in message["tolerance"])
    references = _load(case_dir, "reference.npz") or []
    truths = _load(case_dir, "truth.npz") if message.get("truth") == "ok" else None
    narrows = _load(case_dir, "coarse.npz") if message.get("coarse") == "ok" else None
    pinned, in_loops = (int(n) for n in message.get("rounding") or (0, 0))
    figures = judge_case(references, truths, narrows, atol, rtol, rounding_in_loops=in_loops)
    if in_loops and figures["verdict"] == "uncalibrated" and truths is not None:
        message["truth"] = (
            f"it rounds floats to integers inside a loop or a branch ({in_loops} steps), where "
            "the float64 run rounds some values the other way: its difference "
            f"({_percent(figures.get('noise_used'))} of the tolerance) is no measure of noise"
        )
    constants = []
    for value, name in message.get("constants") or []:
        zeroed = _load(case_dir, name)
        if zeroed is not None and len(zeroed) == len(references):
            pairs = _float_pairs(zeroed, references)
            used = max((tolerance_used(z, r, atol, rtol) for z, r in pairs), default=math.inf)
            constants.append((float(value), used))
    chips = _load(case_dir, "chip.npz") if message.get("chip") == "ok" else None
    if chips is not None and truths is not None and len(chips) == len(truths):
        pairs = _float_pairs(chips, truths)
        figures["chip_used"] = max((tolerance_used(c, t, atol, rtol) for c, t in pairs), default=0)
        figures["chip_max_abs"] = max(
            (float(np.nanmax(np.abs(c.astype(np.float64) - t))) for c, t in pairs if t.size),
            default=0.0,
        )
    notes = [
        m
        for m in (message.get("truth"), message.get("coarse"), message.get("chip"))
        if m and m != "ok"
    ]
    return CaseNoise(
        suite=message["suite"],
        name=message["name"],
        dims=message.get("dims") or {},
        dtype=message["dtype"],
        profile=message["profile"],
        atol=atol,
        rtol=rtol,
        reference_s=float(message.get("reference_s") or 0.0),
        note="; ".join(notes),
        constants=constants,
        outputs=[r.dtype.name for r in references],
        output_max_abs=max(
            (float(np.abs(r[np.isfinite(r)]).max(initial=0.0)) for r in references if r.size),
            default=0.0,
        ),
        rounding_steps=pinned,
        rounding_in_loops=in_loops,
        **figures,
    )


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.3g}%"
