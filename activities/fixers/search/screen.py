"""Screening candidate edits: a sandboxed check of each, on the suite the kernel fails.

Every edit is checked exactly as ``nearmiss check`` would (its own sandbox children, the
integrity gate enforcing), on the suite that failed and the targets the evidence judged, at a
fixed seed, without control experiments (they explain failures; screening only ranks). Checks
run ``Budget.lanes`` at a time, in the edits' order, and stop at the first edit that passes, or
when the budget is spent; among edits judged in the same batch the earlier wins, so the answer
does not depend on which check finished first.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from activities.evidence import score
from nearmiss.check import check
from nearmiss.errors import UsageError
from nearmiss.runner.sandbox import Limits
from workflows.models import FixRequest

SEED = 1  # screening is reproducible; the loop's full check draws its own inputs


@dataclass(frozen=True)
class Budget:
    """How much one round may screen: at most ``checks`` edits and about ``seconds`` (a batch
    that has started finishes), ``lanes`` checks at a time, each case within ``case_timeout_s``
    (a mutant that loops without end costs that, not the round)."""

    checks: int = 64
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


def screen(request: FixRequest, sources: list[str], budget: Budget) -> Screen:
    started = time.perf_counter()
    evidence = request.evidence
    suite = "compact" if evidence.compact_passed is False else "all"
    targets = tuple(evidence.targets) or None
    limits = Limits(case_timeout_s=budget.case_timeout_s)
    with tempfile.TemporaryDirectory(prefix="nearmiss-search-") as scratch:
        spec = Path(scratch) / "spec.py"
        spec.write_text(request.spec_source)

        def judged(index: int | str, source: str) -> float:
            folder = Path(scratch) / str(index)
            folder.mkdir()
            candidate = folder / request.candidate_name
            candidate.write_text(source)
            try:
                return score(
                    check(spec, candidate, suite, SEED, limits, targets=targets, controls=False)
                )
            except UsageError:  # an edit the gate cannot even admit
                return -1.0

        baseline = judged("kernel", request.source)
        if baseline >= 1.0:
            why = f"the kernel passes the {suite} suite at the screening seed: nothing to rank by"
            return Screen(0, time.perf_counter() - started, why=why)
        best, best_score, screened = None, baseline, 0
        wanted = sources[: budget.checks]
        with ThreadPoolExecutor(budget.lanes) as pool:
            for first in range(0, len(wanted), budget.lanes):
                if time.perf_counter() - started > budget.seconds:
                    break
                batch = range(first, min(first + budget.lanes, len(wanted)))
                scores = list(pool.map(lambda i: judged(i, wanted[i]), batch))
                screened += len(scores)
                for index, value in zip(batch, scores, strict=True):
                    if value >= 1.0:
                        return Screen(screened, time.perf_counter() - started, index, True)
                    if value > best_score:
                        best, best_score = index, value
        return Screen(screened, time.perf_counter() - started, best)
