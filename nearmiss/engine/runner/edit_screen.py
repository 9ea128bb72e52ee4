"""Screening many edits of one kernel in one warm sandbox child (the search fixer's inner loop).

A check starts fresh children for its one candidate — three interpreters importing JAX, about
2.5 s on two cores before any kernel runs — because a certificate must not depend on anything
another candidate did. Screening only ranks edits; whatever it picks is then checked in full,
in fresh children. So the edits of one search round share one child (``screen_child``): JAX
is imported once, the edits come a batch at a time, each imported as a module of its own and
run on the inputs a baseline run of the suite filed, the batch's programs compiled as one; their
outputs are compared here, by the engine, against that run's references. Each case's answer
names the program the edit traced to; a program already judged on that case (``known``) is
not run again, and its verdict is the caller's to reuse (``Screened.known``).

An edit that hangs or kills the child costs its timeout, as it would alone (its import is
bounded as a candidate's, less the allowance for starting JAX, which the child did before its
``ready``), and the child is replaced: a trace that hangs is known to be its edit's (the child
reports each edit as it is traced); a batch that fails otherwise (its joint run hangs, the
child dies while edits are still being sent) is screened again one edit at a time, so that
each failure is its own edit's. The sandbox, limits and namespaces are those of every child.
``lines_run`` runs the kernel itself with a line tracer, for the lines the suite reaches.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path

from nearmiss.engine.runner.home_files import remove, write
from nearmiss.engine.runner.sandbox import ChildFailure, ChildTimeout, Limits
from nearmiss.engine.runner.session import RawCase, RawRun, _Child

SCREEN_MODULE = "nearmiss.engine.runner.screen_child"


@dataclasses.dataclass
class Screened:
    """One case of one edit as the child screened it: ``raw`` holds its outputs or error for
    the engine's comparison, unless ``known``: the edit traced to ``program``, which the caller
    already judged on this case (or which an earlier edit of the same batch ran), and nothing
    was run. ``program`` is None where the trace failed or the program is not keyed."""

    raw: RawCase
    program: str | None = None
    known: bool = False


class _BatchFailed(Exception):
    """A batch of several edits failed after its traces: each is screened again alone."""


class EditScreen(_Child):
    """Runs edits of a kernel on a baseline run's cases; ``judge`` gives each case's raw result
    (the baseline's reference, the edit's outputs or error) for the engine's comparison."""

    def __init__(self, baseline: RawRun, inputs: Path, limits: Limits, platform: str = "cpu"):
        super().__init__(SCREEN_MODULE, "nearmiss-screen-", limits, platform)
        self.cases = [c for c in baseline.cases if (inputs / c.info.key / "inputs.npz").exists()]
        self.inputs = inputs
        self.lines: frozenset[int] | None = None  # set by ``lines_run``
        self.starting = False  # started, its ``ready`` not yet read

    def start(self, wait: bool = True) -> None:
        """Start the child and file the cases' inputs in its home; a child that does not get
        ready is stopped and the ChildFailure raised. Without ``wait``, its ``ready`` is read
        when it is first used: the child imports JAX meanwhile. (Whichever thread starts a
        child must outlive it: bubblewrap stops a child when the thread that started it ends.)"""
        super().start()
        self.starting = True
        try:
            for raw in self.cases:
                self.put(self.inputs / raw.info.key / "inputs.npz", raw, "inputs.npz")
        except BaseException:
            self.stop()
            raise
        if wait:
            self._ready()

    def _ready(self) -> None:
        assert self.child is not None
        try:
            message = self.child.receive(self.limits.import_timeout_s)
            if message.get("event") != "ready":
                raise ChildFailure(f"the screening child did not start: {message.get('event')!r}")
        except BaseException:
            self.stop()
            raise
        self.starting = False

    def lines_run(self, source: str) -> frozenset[int] | None:
        """The lines of ``source`` that ran (its import, every case); None where the child
        gave no usable answer. The child runs untrusted code: this only guides screening."""
        self.lines = None
        self.judge_alone(-1, source, {}, lines=True)
        return self.lines

    def judge(self, index: int, source: str) -> list[RawCase]:
        """Each case of the baseline as the edit ``source`` ran it."""
        return [screened.raw for screened in self.judge_alone(index, source, {})]

    def judge_alone(
        self, index: int, source: str, known: Mapping[str, Collection[str]], lines: bool = False
    ) -> list[Screened]:
        """One edit screened on each case, in a batch of its own: whatever fails is its own.
        Asked ``lines``, the lines that ran go into ``self.lines``."""
        return self._batch(iter([(index, source)]), known, lines, [], alone=True)[index]

    def judge_batch(
        self, edits: Iterable[tuple[int, str]], known: Mapping[str, Collection[str]]
    ) -> dict[int, list[Screened]]:
        """Each edit (index, source) screened on each case, by index; a program in ``known``
        (by the case's key) is not run. The edits are taken as they come: each goes to the
        child as soon as it is given, so that making the next (a static check, say) overlaps
        the child's work on this one. Raises ChildFailure only where a child does not even
        start."""
        pending = iter(edits)
        taken: list[tuple[int, str]] = []
        try:
            return self._batch(pending, known, False, taken, alone=False)
        except _BatchFailed:  # each edit sent screened again alone; those never sent, as one
            found = {index: self.judge_alone(index, source, known) for index, source in taken}
            return found | self.judge_batch(pending, known)

    def _batch(
        self,
        pending: Iterator[tuple[int, str]],
        known: Mapping[str, Collection[str]],
        lines: bool,
        taken: list[tuple[int, str]],
        alone: bool,
    ) -> dict[int, list[Screened]]:
        """The edits of ``pending`` sent to the child (each appended to ``taken``), then run;
        _BatchFailed where a failure cannot be told to be one edit's, unless ``alone``."""
        first = next(pending, None)
        if first is None:
            return {}
        if self.child is None:
            self.start()
        elif self.starting:
            self._ready()
        assert self.child is not None
        home = self.child.home
        screened: dict[int, list[Screened]] = {}
        paths: list[Path] = []
        sending, traced = True, 0
        try:
            for index, source in itertools.chain([first], pending):
                output = f"output-{len(taken)}.npz"
                taken.append((index, source))
                screened[index] = [Screened(_fresh(raw)) for raw in self.cases]
                if len(taken) == 1:
                    self.child.send(
                        cmd="screen",
                        cases=[str(self.case_dir(raw)) for raw in self.cases],
                        known=[sorted(known.get(raw.info.key, ())) for raw in self.cases],
                        lines=lines,
                    )
                for raw in self.cases:  # never read an earlier batch's outputs as this one's
                    remove(home, f"cases/{raw.info.key}/{output}")
                paths.append(write(home, f"edit_{index}.py", source.encode()))  # past any link
                self.child.send(cmd="edit", index=index, path=str(paths[-1]), output=output)
            self.child.send(cmd="run")
            sending = False
            # Each edit's import and traces as long as one edit's import and cases may take (the
            # child said ``ready``: its own start-up is behind it, and no edit is given that
            # allowance); then the batch's run as long as one edit's cases, and a case's more
            # for the compile of its programs together (seconds, where one takes a second or so).
            each = self.limits.code_import_timeout_s + self.limits.case_timeout_s * len(self.cases)
            for index, _ in taken:
                message = self.child.receive(each)
                if message.get("event") != "edit_traced" or message.get("index") != index:
                    raise ValueError(f"unexpected message {message.get('event')!r}")
                traced += 1
            message = self.child.receive(self.limits.case_timeout_s * (len(self.cases) + 1))
            if message.get("event") != "batch_done":
                raise ValueError(f"unexpected message {message.get('event')!r}")
            answers = message["edits"]
            if not isinstance(answers, list) or len(answers) != len(taken):
                raise ValueError("one answer per edit expected")
            ran = {raw.info.key: set(known.get(raw.info.key, ())) for raw in self.cases}
            for slot, ((index, _), answer) in enumerate(zip(taken, answers, strict=True)):
                self._record(index, answer, screened[index], f"output-{slot}.npz", ran)
            if lines:
                self.lines = _line_numbers(message.get("lines"))
        except ChildFailure as exc:
            self.stop()
            if not alone and (sending or traced == len(taken)):
                raise _BatchFailed from exc
            blamed = first[0] if alone else taken[traced][0]
            for case in screened[blamed]:
                case.raw.failure = "timeout" if isinstance(exc, ChildTimeout) else "died"
                case.raw.failure_detail, case.raw.log_tail = str(exc), exc.log_tail
            if not alone:  # the edit being traced failed; the others are screened again
                others = [edit for edit in taken if edit[0] != blamed]
                return {blamed: screened[blamed]} | self.judge_batch(others, known)
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:  # forged
            self.stop()
            if not alone:
                raise _BatchFailed from exc
            for case in screened[first[0]]:
                case.known, case.raw.outputs, case.raw.error = False, None, None
                case.raw.failure = "died"
                case.raw.failure_detail = f"unusable screening answer: {exc!r}"
        finally:
            for path in paths:
                path.unlink(missing_ok=True)
        return screened

    def _record(
        self,
        index: int,
        answer: dict,
        cases: list[Screened],
        output: str,
        ran: dict[str, set[str]],
    ) -> None:
        """One edit's answer onto its cases. A case said ``known`` must name a program the
        engine knew, or one an earlier edit of the batch ran (``ran``, by case)."""
        if answer.get("index") != index:
            raise ValueError("answers out of order")
        if "error" in answer:  # its import
            for case in cases:
                case.raw.error = {**answer["error"], "phase": "import"}
            return
        results = answer["cases"]
        if not isinstance(results, list) or len(results) != len(cases):
            raise ValueError("one answer per case expected")
        for case, result in zip(cases, results, strict=True):
            raw, program = case.raw, result.get("program")
            if program is not None and not isinstance(program, str):
                raise ValueError("a program key is a string")
            case.program = program
            if result.get("known"):
                if program not in ran[raw.info.key]:
                    raise ValueError("a program said known that was never judged")
                case.known = True
                continue
            if result.get("ok"):
                raw.outputs, raw.output_extra = self.load(raw, output)
                raw.output_tree = str(result["treedef"])
            else:
                error = result["error"]
                if error.get("phase") not in ("trace", "compile", "run"):
                    raise ValueError("error record without a valid phase")
                raw.error = error
            if program is not None:
                ran[raw.info.key].add(program)


def _line_numbers(value: object) -> frozenset[int] | None:
    if not isinstance(value, list) or not all(type(n) is int for n in value):
        return None
    return frozenset(value)


def _fresh(raw: RawCase) -> RawCase:
    """The baseline's case (its reference and inputs) with nothing of the baseline's run."""
    return dataclasses.replace(
        raw,
        outputs=None,
        output_extra={},
        output_tree=None,
        error=None,
        failure=None,
        failure_detail="",
        log_tail="",
        narrow_floats=None,
        compile_s=None,
        run_s=None,
        audited=False,
        audit=None,
        traced_callbacks=[],
        audit_error="",
        reference_work=None,
        inputs_changed=[],
        probes=[],
        targets={},
        lowered={},
    )
