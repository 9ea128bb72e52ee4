"""Control experiments: the small variations of a failing case that isolate its trigger.

An engineer looking at a failing case runs the controls before touching the kernel: the same dims
with the normal value profile, the nearest dims the kernel's blocks divide with the same values,
float32 for a bfloat16 case. One case's numbers cannot tell a ragged-width bug whose errors
spread over whole rows from a plain wrong value, nor an adversarial profile from a bug that
fires at any values; the controls can, at zero tokens.

The engine plans them from the suite's failing numeric cases (``plan``), runs them in one more
round of the same sandbox children (``runner.session``), and concludes (``conclude``): each
failing case gets its controls and a sentence naming the trigger, and its class follows from
them — ``boundary`` when the aligned dims pass, else ``unstable`` when the normal profile at the
*same* dims passes. A control never certifies anything: the verdict is the suite's alone.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nearmiss.engine.models import CaseResult, ControlResult, FailureClass
from nearmiss.engine.spec import NORMAL_PROFILE

# Failing cases worth controls: the numbers are wrong (a crash says where it is by itself).
CONTROLLED_CLASSES = ("wrong_values", "precision", "unstable", "boundary", "nan_inf")
MAX_CONTROLS = 4  # control cases run per check (a suite case or a cached result is free)
NARROW_DTYPES = ("bfloat16", "float16")
# Where the kernel's output blocks say nothing about a dim: the TPU tile's lanes and sublanes.
LANES, SUBLANES = 128, 8
CACHE_SIZE = 512


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block


def _output_blocks(geometry: Sequence[Mapping[str, Any]]) -> dict[int, set[int]]:
    """{output axis size: the blocks that tile it} over the kernel's pallas_calls; a block of 1
    or of the whole axis tiles nothing."""
    blocks: dict[int, set[int]] = {}
    for call in geometry:
        for output in call.get("outputs", []):
            for size, block in zip(output["array_shape"], output["block_shape"], strict=False):
                if isinstance(block, int) and block > 1 and block != size:
                    blocks.setdefault(size, set()).add(block)
    return blocks


def alignment(dims: Mapping[str, int], geometry: Sequence[Mapping[str, Any]]) -> dict:
    """{dim: (size, aligned size, block)} for each dim its block does not divide.

    A dim the size of an output axis the kernel tiles takes that axis's block
    (``runner.geometry``); any other takes the tile: a multiple of 128 above 128, of 8 up to
    it; a dim under 8 (a batch, a head count) is left alone. A block that covers its whole
    axis says nothing (the kernel may loop over the axis inside, in blocks of its own)."""
    blocks = _output_blocks(geometry)
    changed = {}
    for name, size in dims.items():
        if size in blocks:
            block = max(blocks[size], key=lambda b: _round_up(size, b))
        elif size < SUBLANES:
            continue
        else:
            block = SUBLANES if size <= LANES else LANES
        if size % block:
            changed[name] = (size, _round_up(size, block), block)
    return changed


def one_block(dims: Mapping[str, int], geometry: Sequence[Mapping[str, Any]]) -> dict:
    """{dim: (size, block, block)} for each dim an output block tiles in more than one grid
    step: the one-step control shrinks it to a single block (a kernel wrong only across grid
    steps — an accumulator or an index map between blocks — passes there)."""
    blocks = {
        size: min(smaller)
        for size, found in _output_blocks(geometry).items()
        if (smaller := [b for b in found if b < size])
    }
    return {
        name: (size, blocks[size], blocks[size]) for name, size in dims.items() if size in blocks
    }


@dataclass
class Control:
    """One planned control of one failing case."""

    of: tuple[str, str]  # (suite, name) of the failing case
    kind: str  # "normal", "aligned", "float32", "one_block" or "aligned-DIM"
    varies: Literal["profile", "dims", "dtype"]
    dims: dict[str, int]
    dtype: str
    profile: str
    changed: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def variant(self) -> tuple:
        return (tuple(sorted(self.dims.items())), self.dtype, self.profile)


def _word(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def case_controls(case: CaseResult, geometry: Sequence[Mapping[str, Any]]) -> list[Control]:
    """The controls that apply to one failing case, most telling first."""
    of = (case.suite, case.name)
    found = []
    if case.profile != NORMAL_PROFILE:
        found.append(Control(of, "normal", "profile", case.dims, case.dtype, NORMAL_PROFILE))
    changed = alignment(case.dims, geometry)
    if changed:
        dims = {**case.dims, **{d: now for d, (_, now, _) in changed.items()}}
        found.append(Control(of, "aligned", "dims", dims, case.dtype, case.profile, changed))
    if case.dtype in NARROW_DTYPES:
        found.append(Control(of, "float32", "dtype", case.dims, "float32", case.profile))
    single = one_block(case.dims, geometry)
    if single:
        dims = {**case.dims, **{d: now for d, (_, now, _) in single.items()}}
        found.append(Control(of, "one_block", "dims", dims, case.dtype, case.profile, single))
    return found


def split_controls(aligned: Control) -> list[Control]:
    """Which of several ragged dims it is: each aligned alone (after the aligned control passes)."""
    return [
        Control(
            aligned.of,
            f"aligned-{_word(dim)}",
            "dims",
            {**aligned.dims, **{d: was for d, (was, _, _) in aligned.changed.items()}, dim: now},
            aligned.dtype,
            aligned.profile,
            {dim: (was, now, block)},
        )
        for dim, (was, now, block) in aligned.changed.items()
    ]


def _round_robin(lists: list[list[Control]]) -> Iterable[Control]:
    for rank in range(max((len(x) for x in lists), default=0)):
        for controls in lists:
            if rank < len(controls):
                yield controls[rank]


def _from_case(
    control: Control,
    result: CaseResult,
    source: Literal["run", "suite", "cache"],
    note: str = "",
) -> ControlResult:
    compared = list(result.leaves)
    worst = max(compared, key=lambda leaf: leaf.mismatched) if compared else None
    return ControlResult(
        name=f"{control.of[1]}.{control.kind}" if source != "suite" else result.name,
        varies=control.varies,
        dims=control.dims,
        dtype=control.dtype,
        profile=control.profile,
        passed=result.passed,
        failure_class=result.failure_class,
        max_abs_error=max(leaf.max_abs_error for leaf in compared) if compared else None,
        mismatched_fraction=worst.mismatched_fraction if worst else None,
        source=source,
        note=note,
    )


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ControlCache:
    """Control results per (candidate source, spec source, control case): a check of the same
    candidate on the same spec does not run the same control again. In-process, bounded, and
    shared by the checks a worker runs on its threads."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[tuple, ControlResult] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple) -> ControlResult | None:
        with self.lock:
            found = self.entries.get(key)
            if found is not None:
                self.entries.move_to_end(key)
            return found

    def put(self, key: tuple, result: ControlResult) -> None:
        with self.lock:
            self.entries[key] = result
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


CACHE = ControlCache()


class ControlPlan:
    """The controls of one check: planned from the suite's results, concluded with the runs'."""

    def __init__(self, candidate_source: str, spec_source: str, cache: ControlCache = CACHE):
        self.key = (source_hash(candidate_source), source_hash(spec_source))
        self.cache = cache
        self.planned: list[Control] = []
        self.runs: dict[tuple, str] = {}  # variant -> name of the control case run for it
        self.known: dict[tuple, ControlResult] = {}  # variant -> result from the suite or cache
        self.suite: dict[tuple, CaseResult] = {}  # variant -> the suite's own case
        self.split_done: list[Control] = []  # aligned controls already considered for a split

    def plan(
        self, cases: Sequence[CaseResult], geometries: Sequence[Sequence[Mapping[str, Any]]]
    ) -> list[dict[str, Any]]:
        """The first round of control cases to run: {"name", "dims", "dtype", "profile"} each;
        controls the suite already ran, or an earlier check did, are free."""
        self.suite = {(tuple(sorted(c.dims.items())), c.dtype, c.profile): c for c in cases}
        failing = [
            case_controls(case, geometry)
            for case, geometry in zip(cases, geometries, strict=True)
            if not case.passed and case.failure_class in CONTROLLED_CLASSES
        ]
        return self._schedule(_round_robin(failing))

    def split(self, ran: Mapping[str, CaseResult | str]) -> list[dict[str, Any]]:
        """The second round: where aligning several ragged dims together made a case pass,
        each aligned alone (as far as the budget goes), to name the one that triggers it."""
        more = []
        for control in list(self.planned):
            if control.kind != "aligned" or len(control.changed) < 2 or control in self.split_done:
                continue
            self.split_done.append(control)
            known = self.known.get(control.variant)
            result = ran.get(self.runs.get(control.variant, ""))
            if (known and known.passed) or (isinstance(result, CaseResult) and result.passed):
                more.append(split_controls(control))
        return self._schedule(_round_robin(more))

    def _schedule(self, controls: Iterable[Control]) -> list[dict[str, Any]]:
        wanted = []
        for control in controls:
            variant = control.variant
            if variant in self.known or variant in self.runs:
                self.planned.append(control)
            elif variant in self.suite:
                found = self.suite[variant]
                label = f"suite case {found.suite}/{found.name}"
                self.known[variant] = _from_case(control, found, "suite", label)
                self.planned.append(control)
            elif (cached := self.cache.get((*self.key, variant))) is not None:
                self.known[variant] = cached.model_copy(update={"source": "cache"})
                self.planned.append(control)
            elif len(self.runs) < MAX_CONTROLS:
                name = f"{_word(control.of[1])}.{control.kind}"
                while name in self.runs.values():
                    name += "_"
                self.runs[variant] = name
                self.planned.append(control)
                wanted.append(
                    {
                        "name": name,
                        "dims": dict(control.dims),
                        "dtype": control.dtype,
                        "profile": control.profile,
                    }
                )
        return wanted

    def conclude(self, cases: list[CaseResult], ran: Mapping[str, CaseResult | str]) -> set:
        """Each failing case's controls, trigger sentence and class, from the control runs
        (``ran``: name -> its result, or why the spec could not serve it). Returns the cases
        (suite, name) whose value profile a control judged: not for ``refine_unstable``."""
        for variant, name in self.runs.items():
            control = next(c for c in self.planned if c.variant == variant)
            result = ran.get(name, "not run")
            if isinstance(result, str):
                self.known[variant] = ControlResult(
                    name=name,
                    varies=control.varies,
                    dims=control.dims,
                    dtype=control.dtype,
                    profile=control.profile,
                    note=f"not runnable: {result}",
                )
            else:
                self.known[variant] = _from_case(control, result, "run")
                self.cache.put((*self.key, variant), self.known[variant])
        decided = set()
        for case in cases:
            mine = [c for c in self.planned if c.of == (case.suite, case.name)]
            if not mine:
                continue
            results = [self._named(c) for c in mine]
            case.controls = results
            klass, lead, sentence = judge(case, mine, results)
            case.trigger = sentence
            pairs = zip(mine, results, strict=True)
            if any(c.varies == "profile" and r.passed is not None for c, r in pairs):
                decided.add((case.suite, case.name))
            original = case.diagnosis
            case.diagnosis = f"{lead}Controls: {sentence}. {original}"
            if klass is not None:
                case.failure_class = klass
        return decided

    def _named(self, control: Control) -> ControlResult:
        result = self.known[control.variant]
        if result.source == "suite":
            return result
        return result.model_copy(update={"name": f"{control.of[1]}.{control.kind}"})


def _dims_text(changed: Mapping[str, tuple[int, int, int]]) -> str:
    return ", ".join(f"{d}={now}" for d, (_, now, _) in changed.items())


def _where(result: ControlResult) -> str:
    return f", {result.note}" if result.source == "suite" else ""


def _profile_part(case: CaseResult, result: ControlResult) -> str:
    if result.passed:
        return (
            f"the '{case.profile}' value profile triggers it (the normal profile at the same dims "
            f"passes{_where(result)})"
        )
    return (
        f"value profile irrelevant (the normal profile at the same dims also fails{_where(result)})"
    )


def _dtype_part(case: CaseResult, result: ControlResult) -> str:
    if result.passed:
        return f"fails only in {case.dtype} (float32 at the same dims passes{_where(result)})"
    return f"the dtype is not the trigger (float32 at the same dims also fails{_where(result)})"


def _dims_part(
    aligned: tuple[Control, ControlResult] | None,
    passing: list[Control],
    failing: list[Control],
) -> str | None:
    """What aligning the ragged dims did: all of them together, and each alone."""
    alone = ", ".join(next(iter(c.changed)) for c in failing)
    if passing:
        said = []
        for control in passing:
            ((dim, (_, now, block)),) = control.changed.items()
            said.append(f"fails iff {dim} is not a multiple of {block} (aligned {dim}={now} passes")
        tail = f"; aligning {alone} alone does not help)" if failing else ")"
        return (
            "; ".join(f"{text})" for text in said[:-1])
            + ("; " if len(said) > 1 else "")
            + (said[-1] + tail)
        )
    if aligned is None:
        return None
    control, result = aligned
    dims = _dims_text(control.changed)
    if not result.passed:
        return f"the ragged size is not the trigger (aligned {dims} also fails{_where(result)})"
    if len(control.changed) == 1:
        ((dim, (_, _, block)),) = control.changed.items()
        return (
            f"fails iff {dim} is not a multiple of {block} (aligned {dims} passes{_where(result)})"
        )
    text = f"fails only at unaligned dims (aligned {dims} passes{_where(result)}"
    return text + ("; aligning any one alone does not help)" if failing else ")")


def _one_block_part(control: Control, result: ControlResult) -> str:
    dims = _dims_text(control.changed)
    if result.passed:
        return (
            f"fails only when the grid takes more than one step (one block, {dims}, "
            f"passes{_where(result)})"
        )
    return f"one grid step fails too (one block, {dims}{_where(result)})"


def judge(
    case: CaseResult, controls: list[Control], results: list[ControlResult]
) -> tuple[FailureClass | None, str, str]:
    """(new class or None to keep it, a lead for the diagnosis when the class changes, the
    controls' sentence) for one failing case."""
    parts: list[str] = []
    aligned = None
    passing: list[Control] = []
    failing: list[Control] = []
    profile_passes = False
    for control, result in zip(controls, results, strict=True):
        if result.passed is None:
            what = {"profile": "normal-profile", "dtype": "float32"}.get(control.varies, "aligned")
            what = "one-block" if control.kind == "one_block" else what
            why = result.note.removeprefix("not runnable: ")
            parts.append(f"the {what} control ({control.kind}) could not run: {why}")
        elif control.kind == "one_block":
            parts.append(_one_block_part(control, result))
        elif control.kind == "aligned":
            aligned = (control, result)
        elif control.kind.startswith("aligned-"):
            (passing if result.passed else failing).append(control)
        elif control.varies == "profile":
            profile_passes = bool(result.passed)
            parts.append(_profile_part(case, result))
        else:
            parts.append(_dtype_part(case, result))
    dims = _dims_part(aligned, passing, failing)
    if dims is not None:
        parts.insert(0, dims)
    ragged = bool(passing) or (aligned is not None and bool(aligned[1].passed))
    sentence = "; ".join(parts)
    if ragged and case.failure_class != "boundary":
        lead = (
            "Fails only at a size the kernel's blocks do not divide: the partial block is "
            "mishandled (padded lanes read unmasked into a sum, mean or max, or counted in a "
            "divisor; a mask on the wrong bound; a grid that floor-divides), even though the "
            "errors are not confined to the ragged tail. "
        )
        return "boundary", lead, sentence
    if not ragged and profile_passes and case.failure_class != "unstable":
        lead = (
            f"Passes on normal inputs at the same dims but fails on the '{case.profile}' value "
            "profile. "
        )
        return "unstable", lead, sentence
    return None, "", sentence
