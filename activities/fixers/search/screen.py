"""Screening candidate edits: each run on the suite the kernel fails, the edits ranked.

Where the kernel's numbers are wrong in interpret mode (the usual case), one baseline run of the
failing suite files its inputs and references, and the edits are then run on them in warm
sandbox children (``nearmiss.engine.runner.edit_screen``: JAX imported once per child, not three
times per edit), ``Budget.lanes`` children at a time; the engine compares each edit's outputs.
Where the numbers are right and only a target or the gate objects, each edit gets a whole
sandboxed check instead, with the evidence's targets and the gate enforcing. Either way at a
fixed seed, without control experiments (they explain failures; screening only ranks), in the
edits' order, until the budget is spent or a few edits past the first that passes
(``Budget.after_pass``): a spec often cannot tell the fix from a patch that passes it, so where
several edits pass, the first few are checked again in fresh children with the engine's hidden
cases (inputs the spec allows but does not list); an edit that fails them is not proposed, and
those that pass them all are said to be alike ("the spec cannot tell these apart"). Among edits
that pass, the earlier in the edits' order wins, so the answer does not depend on which
finished first. In the warm case the kernel itself is run once more with a line tracer, and an edit
none of whose statement ran is skipped unscreened: code the failing suite never executes (a
backward pass, the other branch of a block-size dispatch) cannot change what the suite sees.
Screening never certifies: the loop's full check, in fresh children, judges the pick.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import queue
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from activities.evidence import score, score_cases
from nearmiss.engine.check import case_verdict, check
from nearmiss.engine.errors import UsageError
from nearmiss.engine.inputs import parse_source
from nearmiss.engine.integrity.gate import blocks_execution, static_violations
from nearmiss.engine.runner.edit_screen import EditScreen
from nearmiss.engine.runner.sandbox import ChildFailure, Limits
from nearmiss.engine.runner.session import RawRun, run_sandboxed
from nearmiss.engine.targets.registry import DEFAULT_TARGETS
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
    after_pass: int = 16  # edits screened on past the first that passes, to find its rivals
    hidden_checks: int = 4  # passing edits checked again with the hidden cases
    # The round has a deadline (its session's): ``seconds`` is the most it may take, and no
    # hidden-case check starts once they are spent (the first passer stays the pick).
    hard: bool = False

    def within(self, seconds: float) -> Budget:
        """This budget for a round that must end ``seconds`` from now: it screens until
        ``RESERVE_S`` before then (a batch under way finishes, as always)."""
        allowed = max(0.0, min(self.seconds, seconds - RESERVE_S))
        return dataclasses.replace(self, seconds=allowed, hard=True)


# What a round under a deadline leaves for the batch under way to finish and its answer to be
# stored: it stops screening this long before the deadline.
RESERVE_S = 15.0


@dataclass(frozen=True)
class Screen:
    screened: int
    seconds: float
    best: int | None = None  # the index of the edit to propose
    passed: bool = False  # whether it passes the screening suite
    why: str = ""  # why there is no edit to propose, where it is not "none got further"
    unreached: int = 0  # edits skipped unscreened: they edit code the suite never ran
    # Every edit that passed the screening suite, (index, source), in the edits' order.
    passers: tuple[tuple[int, str], ...] = ()
    alike: tuple[int, ...] = ()  # others that pass as ``best`` does, hidden cases included
    told_apart: tuple[int, ...] = ()  # passers the hidden cases refused


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
        cases = [case_verdict(raw, request.candidate_name) for raw in baseline.cases]
        if cases and not all(c.passed for c in cases):
            warm = _Warm(request, baseline, inputs, limits)
            try:
                reached = _Reached(request.source, warm.lines_run())
                edits = reached.edits(enumerate(sources))
                found = _rank(edits, budget, score_cases(cases), warm, started)
                found = dataclasses.replace(found, unreached=reached.skipped)
            finally:
                warm.close()
        else:
            fresh = _fresh(request, folder, suite, limits)
            base = fresh("kernel", request.source)
            if base >= 1.0:
                why = (
                    f"the kernel passes the {suite} suite at the screening seed: nothing to rank by"
                )
                return Screen(0, time.perf_counter() - started, why=why)
            found = _rank(enumerate(sources), budget, base, fresh, started)
        if len(found.passers) < 2:
            return found
        # the whole suite, where the hidden cases are drawn (the screening seed's, not the
        # certifying check's: that one draws its own)
        hidden = _fresh(request, folder, "all", limits, hidden=True)
        return _told_apart(found, hidden, budget, started)


Judge = Callable[[int | str, str], float]  # (index, source) -> score; 1.0: passes


def _rank(
    edits: Iterable[tuple[int, str]], budget: Budget, baseline: float, judged: Judge, started: float
) -> Screen:
    """The edits (index, source) judged in order, ``budget.lanes`` at a time, until the budget
    is spent or ``budget.after_pass`` edits past the first that passes; the best's index (the
    edit's own, whatever was skipped before): the first that passes, else the furthest."""
    best, best_score, screened = None, baseline, 0
    passers: list[tuple[int, str]] = []
    stop_at = budget.checks
    wanted = itertools.islice(edits, budget.checks)
    with ThreadPoolExecutor(budget.lanes) as pool:
        while screened < stop_at and time.perf_counter() - started <= budget.seconds:
            batch = list(itertools.islice(wanted, min(budget.lanes, stop_at - screened)))
            if not batch:  # edits made as they are due
                break
            scores = list(pool.map(lambda item: judged(*item), batch))
            screened += len(scores)
            for (index, source), value in zip(batch, scores, strict=True):
                if value >= 1.0:
                    if not passers:
                        stop_at = min(stop_at, screened + budget.after_pass)
                    passers.append((index, source))
                elif value > best_score:
                    best, best_score = index, value
    seconds = time.perf_counter() - started
    if passers:
        return Screen(screened, seconds, passers[0][0], True, passers=tuple(passers))
    return Screen(screened, seconds, best)


def _told_apart(found: Screen, hidden: Judge, budget: Budget, started: float) -> Screen:
    """Several edits pass the screening suite: the first ``budget.hidden_checks`` of them
    checked again with the hidden cases. The first that passes them is proposed, the others
    that do are alike; where none does, the first passer stays the pick (the loop's own check
    will refuse it) and nothing is said alike. Under a deadline (``Budget.hard``) only while
    the budget's seconds last: those not checked by then count as neither."""
    judged: list[int] = []
    passed: list[int] = []
    for index, source in found.passers[: budget.hidden_checks]:
        if budget.hard and time.perf_counter() - started > budget.seconds:
            break
        judged.append(index)
        if hidden(f"hidden-{index}", source) >= 1.0:
            passed.append(index)
    refused = tuple(index for index in judged if index not in passed)
    if not passed:
        return dataclasses.replace(found, told_apart=refused)
    return dataclasses.replace(found, best=passed[0], alike=tuple(passed[1:]), told_apart=refused)


class _Warm:
    """Each edit run on the baseline's inputs in a warm child, one child per lane at a time
    (an idle one reused); an edit the gate's static rules refuse scores 0 unrun. ``close``
    stops the children."""

    def __init__(self, request: FixRequest, baseline: RawRun, inputs: Path, limits: Limits):
        self.request, self.baseline, self.inputs, self.limits = request, baseline, inputs, limits
        self.children: list[EditScreen] = []
        self.idle: queue.SimpleQueue[EditScreen] = queue.SimpleQueue()

    def __call__(self, index: int | str, source: str) -> float:
        name = self.request.candidate_name
        if static_violations(source, name):
            return 0.0
        child = self._take()
        try:
            ran = child.judge(int(index), source)
        except ChildFailure:  # the child did not even start: this edit cannot be ranked
            return -1.0
        finally:
            self.idle.put(child)
        cases = [case_verdict(raw, name) for raw in ran]
        return 1.0 if cases and all(c.passed for c in cases) else score_cases(cases)

    def lines_run(self) -> frozenset[int] | None:
        """The kernel's own lines that its run of the suite executes; None: not known."""
        child = self._take()
        try:
            return child.lines_run(self.request.source)
        except ChildFailure:
            return None
        finally:
            self.idle.put(child)

    def _take(self) -> EditScreen:
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            child = EditScreen(self.baseline, self.inputs, self.limits)
            self.children.append(child)
            return child

    def close(self) -> None:
        for child in self.children:
            child.stop()


class _Reached:
    """Which edits touch code the kernel's run executed: an edit is kept when a line of the
    smallest statement holding its change ran (a compound statement's header counts for its
    body, a function's ``def`` for its parameters). Where the lines are not known, all are."""

    def __init__(self, source: str, lines: frozenset[int] | None) -> None:
        self.original = source.splitlines()
        self.lines = lines
        self.skipped = 0
        self.statement: dict[int, tuple[int, int]] = {}  # line -> its smallest statement
        tree = parse_source(source) if lines else None
        statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)] if tree else []
        for node in sorted(statements, key=lambda n: n.lineno - (n.end_lineno or n.lineno)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                self.statement[line] = (node.lineno, node.end_lineno or node.lineno)

    def edits(self, edits: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str]]:
        for index, source in edits:
            if self.reached(source):
                yield index, source
            else:
                self.skipped += 1

    def reached(self, edited: str) -> bool:
        if not self.lines:
            return True
        first, last = _changed(self.original, edited.splitlines())
        if last < first or first not in self.statement:  # lines only added: keep it
            return True
        start, end = self.statement[first]
        return any(line in self.lines for line in range(start, max(end, last) + 1))


def _changed(original: list[str], edited: list[str]) -> tuple[int, int]:
    """The first and last lines (1-based) of ``original`` that ``edited`` changes."""
    shortest = min(len(original), len(edited))
    head = next((i for i in range(shortest) if original[i] != edited[i]), shortest)
    tail = next(
        (i for i in range(shortest - head) if original[-1 - i] != edited[-1 - i]), shortest - head
    )
    return head + 1, len(original) - tail


def _fresh(
    request: FixRequest, folder: Path, suite: str, limits: Limits, hidden: bool = False
) -> Judge:
    """Each edit checked in full, in fresh children, with the evidence's targets; with the
    engine's hidden cases too where ``hidden`` (to tell apart edits that pass the suite)."""
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
                    hidden=hidden,
                )
            )
        except UsageError:  # an edit the gate cannot even admit
            return -1.0

    return judged
