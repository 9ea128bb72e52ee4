"""Screening candidate edits: each run on the suite the kernel fails, the edits ranked.

Where the kernel's numbers are wrong in interpret mode (the usual case), one baseline run of the
failing suite files its inputs and references, and the edits are then run on them in warm
sandbox children (``nearmiss.runner.edit_screen``: JAX imported once per child, not three
times per edit), ``Budget.lanes`` children at a time; the engine compares each edit's outputs.
Where the numbers are right and only a target or the gate objects, each edit gets a whole
sandboxed check instead, with the evidence's targets and the gate enforcing. Either way at a
fixed seed, without control experiments (they explain failures; screening only ranks), in the
edits' order, stopping at the first edit that passes, or when the budget is spent; among edits
judged in the same batch the earlier wins, so the answer does not depend on which finished
first. Screening never certifies: the loop's full check, in fresh children, judges the pick.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from activities.evidence import score, score_cases
from nearmiss.check import case_result, check
from nearmiss.errors import UsageError
from nearmiss.integrity.gate import blocks_execution, static_violations
from nearmiss.runner.edit_screen import EditScreen
from nearmiss.runner.sandbox import ChildFailure, Limits
from nearmiss.runner.session import RawRun, run_sandboxed
from nearmiss.targets.registry import DEFAULT_TARGETS
from workflows.models import FixRequest

SEED = 1  # screening is reproducible; the loop's full check draws its own inputs


@dataclass(frozen=True)
class Budget:
    """How much one round may screen: at most ``checks`` edits and about ``seconds`` (a batch
    that has started finishes), ``lanes`` checks at a time, each case within ``case_timeout_s``
    (a mutant that loops without end costs that, not the round)."""

    checks: int = 400
    seconds: float = 240.0
    lanes: int = 2
    case_timeout_s: float = 20.0


@dataclass(frozen=True)
class Screen:
    screened: int
    seconds: float
    best: int | None = None  # the index of the edit to propose
    passed: bool = False  # whether it passes the screening suite
    why: str = ""  # why there is no edit to propose, where it is not "none got further"


def screen(request: FixRequest, sources: Iterable[str], budget: Budget) -> Screen:
    started = time.perf_counter()
    evidence = request.evidence
    suite = "compact" if evidence.compact_passed is False else "all"
    limits = Limits(case_timeout_s=budget.case_timeout_s)
    with tempfile.TemporaryDirectory(prefix="nearmiss-search-") as scratch:
        folder = Path(scratch)
        spec = folder / "spec.py"
        spec.write_text(request.spec_source)
        kernel = folder / "baseline" / request.candidate_name
        kernel.parent.mkdir()
        kernel.write_text(request.source)
        inputs = folder / "inputs"
        if blocks_execution(static_violations(request.source, request.candidate_name), "enforce"):
            why = "the integrity gate refuses to run the kernel: no edit of it is screened"
            return Screen(0, time.perf_counter() - started, why=why)
        try:
            baseline = run_sandboxed(
                spec,
                kernel,
                suite,
                SEED,
                limits,
                audit=False,
                source=request.source,
                targets=DEFAULT_TARGETS,
                inputs_to=inputs,
            )
        except UsageError as exc:
            return Screen(0, time.perf_counter() - started, why=f"the baseline run failed: {exc}")
        cases = [case_result(raw, request.candidate_name) for raw in baseline.cases]
        if cases and not all(c.passed for c in cases):
            warm = _Warm(request, baseline, inputs, limits)
            try:
                return _rank(sources, budget, score_cases(cases), warm, started)
            finally:
                warm.close()
        fresh = _fresh(request, folder, suite, limits)
        base = fresh("kernel", request.source)
        if base >= 1.0:
            why = f"the kernel passes the {suite} suite at the screening seed: nothing to rank by"
            return Screen(0, time.perf_counter() - started, why=why)
        return _rank(sources, budget, base, fresh, started)


Judge = Callable[[int | str, str], float]  # (index, source) -> score; 1.0: passes


def _rank(
    sources: Iterable[str], budget: Budget, baseline: float, judged: Judge, started: float
) -> Screen:
    best, best_score, screened = None, baseline, 0
    wanted = enumerate(itertools.islice(sources, budget.checks))
    with ThreadPoolExecutor(budget.lanes) as pool:
        while time.perf_counter() - started <= budget.seconds:
            batch = list(itertools.islice(wanted, budget.lanes))  # edits made as they are due
            if not batch:
                break
            scores = list(pool.map(lambda item: judged(*item), batch))
            screened += len(scores)
            for (index, _), value in zip(batch, scores, strict=True):
                if value >= 1.0:
                    return Screen(screened, time.perf_counter() - started, index, True)
                if value > best_score:
                    best, best_score = index, value
    return Screen(screened, time.perf_counter() - started, best)


class _Warm:
    """Each edit run on the baseline's inputs in a warm child, one per lane (thread); an edit
    the gate's static rules refuse scores 0 unrun. ``close`` stops the children."""

    def __init__(self, request: FixRequest, baseline: RawRun, inputs: Path, limits: Limits):
        self.request, self.baseline, self.inputs, self.limits = request, baseline, inputs, limits
        self.children: dict[int, EditScreen] = {}

    def __call__(self, index: int | str, source: str) -> float:
        name = self.request.candidate_name
        if static_violations(source, name):
            return 0.0
        lane = threading.get_ident()
        if lane not in self.children:
            self.children[lane] = EditScreen(self.baseline, self.inputs, self.limits)
        try:
            ran = self.children[lane].judge(int(index), source)
        except ChildFailure:  # the child did not even start: this edit cannot be ranked
            return -1.0
        cases = [case_result(raw, name) for raw in ran]
        return 1.0 if cases and all(c.passed for c in cases) else score_cases(cases)

    def close(self) -> None:
        for child in self.children.values():
            child.stop()


def _fresh(request: FixRequest, folder: Path, suite: str, limits: Limits) -> Judge:
    """Each edit checked in full, in fresh children, with the evidence's targets."""
    targets = tuple(request.evidence.targets) or None

    def judged(index: int | str, source: str) -> float:
        edit = folder / str(index)
        edit.mkdir()
        candidate = edit / request.candidate_name
        candidate.write_text(source)
        try:
            return score(
                check(
                    folder / "spec.py",
                    candidate,
                    suite,
                    SEED,
                    limits,
                    targets=targets,
                    controls=False,
                )
            )
        except UsageError:  # an edit the gate cannot even admit
            return -1.0

    return judged
