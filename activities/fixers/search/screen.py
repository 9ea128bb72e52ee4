"""Screening candidate edits: each run on the suite the kernel fails, the edits ranked.

Where the kernel's numbers are wrong in interpret mode (the usual case), one baseline run of the
failing suite files its inputs and references, and the edits are then run on them in warm
sandbox children (``nearmiss.engine.runner.edit_screen``: JAX imported once per child, not three
times per edit), ``Budget.lanes`` children at a time, each taking ``Budget.batch`` edits at a
time and compiling their programs as one; the engine compares each edit's outputs. An edit that
traces to a program already judged on a case (many mutants do: a branch the suite never takes,
a value no output reads, the kernel's own program) takes that program's verdict unrun.
Where the numbers are right and only a target or the gate objects, each edit gets a whole
sandboxed check instead, with the evidence's targets and the gate enforcing. Either way at a
fixed seed, without control experiments (they explain failures; screening only ranks), in the
edits' order, until the budget is spent or a few edits past the first that passes
(``Budget.after_pass``): a spec often cannot tell the fix from a patch that passes it, so where
several edits pass, the first few are checked again in fresh children with the engine's hidden
cases (inputs the spec allows but does not list); an edit that fails them is not proposed, and
those that pass them all are said to be alike ("the spec cannot tell these apart"). Among edits
that pass, the earlier in the edits' order wins, and the results are read in that order, so the
answer does not depend on which lane finished first. In the warm case the kernel itself is run
once more with a line tracer, and an edit none of whose statement ran is skipped unscreened:
code the failing suite never executes (a backward pass, the other branch of a block-size
dispatch) cannot change what the suite sees.
Screening never certifies: the loop's full check, in fresh children, judges the pick.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import itertools
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from activities.evidence import score, score_cases
from nearmiss.engine.check import case_verdict, check
from nearmiss.engine.errors import UsageError
from nearmiss.engine.inputs import parse_source
from nearmiss.engine.integrity.gate import (
    EditScan,
    blocks_execution,
    changed_lines,
    static_violations,
)
from nearmiss.engine.models import CaseResult
from nearmiss.engine.runner.edit_screen import EditScreen, Screened
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
    # Edits a warm child takes at a time, their programs compiled as one (``screen_child``):
    # the compiler's fixed costs, and what the edits share, are paid once a batch.
    batch: int = 32
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
                reached = _Reached(request.source, warm.lines_run(budget.lanes))
                edits = reached.edits(enumerate(sources))
                found = _rank(edits, budget, score_cases(cases), warm, started, budget.batch)
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
            found = _rank(enumerate(sources), budget, base, _one_by_one(fresh), started, 1)
        if len(found.passers) < 2:
            return found
        # the whole suite, where the hidden cases are drawn (the screening seed's, not the
        # certifying check's: that one draws its own)
        hidden = _fresh(request, folder, "all", limits, hidden=True)
        return _told_apart(found, hidden, budget, started)


Judge = Callable[[int | str, str], float]  # (index, source) -> score; 1.0: passes
Batches = Callable[[list[tuple[int, str]]], list[float]]  # a lane's edits -> their scores


def _one_by_one(judged: Judge) -> Batches:
    return lambda edits: [judged(index, source) for index, source in edits]


def _rank(
    edits: Iterable[tuple[int, str]],
    budget: Budget,
    baseline: float,
    judged: Batches,
    started: float,
    per_lane: int,
) -> Screen:
    """The edits (index, source) judged in order, ``budget.lanes`` lanes at a time, each lane
    given up to ``per_lane`` edits as it frees (fewer where fewer are left to screen, or fewer
    fit in the seconds left at the pace so far), until the budget is spent or
    ``budget.after_pass`` edits past the first that passes. The results are read in the
    edits' order, whichever lane finished first: the best's index (the edit's own, whatever
    was skipped before) is the first that passes, else the first of the furthest; the passers
    are those up to ``budget.after_pass`` edits past the first (a lane's edits under way when
    the round stops are screened, and count only there)."""
    wanted = itertools.islice(edits, budget.checks)
    groups: list[list[tuple[int, str]]] = []  # as handed out, in the edits' order
    results: dict[int, list[float]] = {}
    running: dict[Future[list[float]], tuple[int, float]] = {}  # -> (group, when it started)
    handed, lane_seconds, timed = 0, 0.0, 0  # edits handed out; lanes' seconds on those timed
    stop_at, read = budget.checks, 0
    best, best_score, screened, first_pass = None, baseline, 0, None
    passers: list[tuple[int, str]] = []
    with ThreadPoolExecutor(budget.lanes) as pool:
        while True:
            while len(running) < budget.lanes and handed < stop_at:
                left = budget.seconds - (time.perf_counter() - started)
                if left < 0:
                    break
                size = min(per_lane, -(-(stop_at - handed) // budget.lanes))
                if timed:  # no more than fit in the seconds left, at the pace so far
                    size = max(1, min(size, int(left / (lane_seconds / timed))))
                group = list(itertools.islice(wanted, size))  # edits made as they are due
                if not group:
                    stop_at = handed
                    break
                running[pool.submit(judged, group)] = (len(groups), time.perf_counter())
                groups.append(group)
                handed += len(group)
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                number, since = running.pop(future)
                results[number] = future.result()
                lane_seconds += time.perf_counter() - since
                timed += len(groups[number])
            while read in results:  # in the edits' order
                for (index, source), value in zip(groups[read], results.pop(read), strict=True):
                    if first_pass is not None and screened > first_pass + budget.after_pass:
                        screened += 1
                        continue
                    if value >= 1.0:
                        if first_pass is None:
                            first_pass = screened
                            stop_at = min(stop_at, screened + 1 + budget.after_pass)
                        passers.append((index, source))
                    elif value > best_score:
                        best, best_score = index, value
                    screened += 1
                read += 1
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
    """The edits run on the baseline's inputs in warm children, a lane's edits as one batch in
    one child (an idle one reused); an edit the gate's static rules refuse scores 0 unrun. The
    engine's verdict on each case is kept by the program the edit traced to: a later edit that
    traces to a program already judged on that case takes that verdict unrun (the child never
    runs it), and so does one that traces to the kernel's own program (the line tracer's run).
    ``close`` stops the children."""

    def __init__(self, request: FixRequest, baseline: RawRun, inputs: Path, limits: Limits):
        self.request, self.baseline, self.inputs, self.limits = request, baseline, inputs, limits
        self.children: list[EditScreen] = []
        self.idle: queue.SimpleQueue[EditScreen] = queue.SimpleQueue()
        self.verdicts: dict[str, dict[str, CaseResult]] = {}  # case -> program -> verdict
        self.lock = threading.Lock()
        # The gate's static rules, each edit scanned where it differs from the kernel.
        self.gate = EditScan(request.source, request.candidate_name)

    def __call__(self, edits: list[tuple[int, str]]) -> list[float]:
        refused: set[int] = set()

        def admitted() -> Iterator[tuple[int, str]]:  # checked as the child takes them
            for index, source in edits:
                if _refused(source, self.gate):
                    refused.add(index)
                else:
                    yield index, source

        screened: dict[int, list[Screened]] | None = None
        child = self._take()
        try:
            with self.lock:
                known = {case: set(programs) for case, programs in self.verdicts.items()}
            screened = child.judge_batch(admitted(), known)
        except ChildFailure:  # the child did not even start: these edits cannot be ranked
            pass
        finally:
            self.idle.put(child)
        return [
            0.0 if index in refused else -1.0 if screened is None else self._score(screened[index])
            for index, _ in edits
        ]

    def _score(self, cases: list[Screened]) -> float:
        verdicts = [self._verdict(case) for case in cases]
        return 1.0 if verdicts and all(v.passed for v in verdicts) else score_cases(verdicts)

    def _verdict(self, case: Screened) -> CaseResult:
        """The engine's verdict on the case, or the one it gave the same program before."""
        raw = case.raw
        with self.lock:
            programs = self.verdicts.setdefault(raw.info.key, {})
            if case.known and case.program in programs:
                return programs[case.program]
        if case.known:  # the child named a program never judged on this case
            raw.failure, raw.failure_detail = "died", "unusable screening answer"
        verdict = case_verdict(raw, self.request.candidate_name)
        if case.program is not None and not case.known and raw.failure is None:
            with self.lock:
                programs.setdefault(case.program, verdict)
        return verdict

    def lines_run(self, lanes: int) -> frozenset[int] | None:
        """The kernel's own lines that its run of the suite executes; None: not known. The
        kernel's own programs are judged by the way: an edit that traces to one of them is,
        to the suite, the kernel. The other ``lanes``' children start meanwhile."""
        child = self._take()
        for _ in range(lanes - 1):
            spare = EditScreen(self.baseline, self.inputs, self.limits)
            self.children.append(spare)
            with contextlib.suppress(ChildFailure):  # started again when its lane takes it
                spare.start(wait=False)
            self.idle.put(spare)
        try:
            for case in child.judge_alone(-1, self.request.source, {}, lines=True):
                self._verdict(case)
            return child.lines
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


def _refused(source: str, gate: EditScan) -> bool:
    """Whether the gate's static rules refuse to run the edit (a rule that fails refuses)."""
    try:
        return bool(gate.violations(source))
    except Exception:
        return True


class _Reached:
    """Which edits touch code the kernel's run executed: an edit is kept when a line of the
    smallest statement holding its change ran (a compound statement's header counts for its
    body, a function's ``def`` for its parameters). A module-level statement other than a
    definition (a constant the kernel reads) runs at import, before the tracer starts: it is
    always kept. Where the lines are not known, all are."""

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
        definitions = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        self.at_import = {
            (n.lineno, n.end_lineno or n.lineno)
            for n in (tree.body if tree else [])
            if not isinstance(n, definitions)
        }

    def edits(self, edits: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str]]:
        for index, source in edits:
            if self.reached(source):
                yield index, source
            else:
                self.skipped += 1

    def reached(self, edited: str) -> bool:
        if not self.lines:
            return True
        first, last = changed_lines(self.original, edited.splitlines())
        if last < first or first not in self.statement:  # lines only added: keep it
            return True
        start, end = self.statement[first]
        if (start, end) in self.at_import:
            return True
        return any(line in self.lines for line in range(start, max(end, last) + 1))


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
