"""Screening many edits of one kernel in one warm sandbox child (the search fixer's inner loop).

A check starts fresh children for its one candidate — three interpreters importing JAX, about
2.5 s on two cores before any kernel runs — because a certificate must not depend on anything
another candidate did. Screening only ranks edits; whatever it picks is then checked in full,
in fresh children. So the edits of one search round share one child (``screen_child``): JAX
is imported once, each edit is imported as a module of its own and run on the inputs a
baseline run of the suite filed; its outputs are compared here, by the engine, against that
run's references. An edit that hangs or kills the child costs its timeout and the child is
replaced for the next; the sandbox, limits and namespaces are those of every child.
``lines_run`` runs the kernel itself with a line tracer, for the lines the suite reaches.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from nearmiss.engine.runner.home_files import remove, write
from nearmiss.engine.runner.protocol import OUTPUT_FILE
from nearmiss.engine.runner.sandbox import ChildFailure, ChildTimeout, Limits
from nearmiss.engine.runner.session import RawCase, RawRun, _Child, _record_outputs

SCREEN_MODULE = "nearmiss.engine.runner.screen_child"


class EditScreen(_Child):
    """Runs edits of a kernel on a baseline run's cases; ``judge`` gives each case's raw result
    (the baseline's reference, the edit's outputs or error) for the engine's comparison."""

    def __init__(self, baseline: RawRun, inputs: Path, limits: Limits, platform: str = "cpu"):
        super().__init__(SCREEN_MODULE, "nearmiss-screen-", limits, platform)
        self.cases = [c for c in baseline.cases if (inputs / c.info.key / "inputs.npz").exists()]
        self.inputs = inputs
        self.lines: frozenset[int] | None = None  # set by ``lines_run``

    def start(self) -> None:
        """Start the child and file the cases' inputs in its home; a child that does not get
        ready is stopped and the ChildFailure raised."""
        super().start()
        assert self.child is not None
        try:
            for raw in self.cases:
                self.put(self.inputs / raw.info.key / "inputs.npz", raw, "inputs.npz")
            message = self.child.receive(self.limits.import_timeout_s)
            if message.get("event") != "ready":
                raise ChildFailure(f"the screening child did not start: {message.get('event')!r}")
        except BaseException:
            self.stop()
            raise

    def lines_run(self, source: str) -> frozenset[int] | None:
        """The lines of ``source`` that ran (its import, every case); None where the child
        gave no usable answer. The child runs untrusted code: this only guides screening."""
        self.lines = None
        self.judge(-1, source, lines=True)
        return self.lines

    def judge(self, index: int, source: str, lines: bool = False) -> list[RawCase]:
        """Each case of the baseline as the edit ``source`` ran it (and, asked ``lines``, the
        lines that ran in ``self.lines``)."""
        if self.child is None:
            self.start()
        assert self.child is not None
        path = write(self.child.home, f"edit_{index}.py", source.encode())  # past any link
        ran = [_fresh(raw) for raw in self.cases]
        try:
            dirs = [str(self.case_dir(raw)) for raw in ran]
            for raw in ran:  # never read the previous edit's outputs as this one's
                remove(self.child.home, f"cases/{raw.info.key}/{OUTPUT_FILE}")
            self.child.send(cmd="screen", index=index, path=str(path), cases=dirs, lines=lines)
            timeout = self.limits.import_timeout_s + self.limits.case_timeout_s * len(ran)
            message = self.child.receive(timeout)
            if message.get("event") != "edit_done" or message.get("index") != index:
                raise ValueError(f"unexpected message {message.get('event')!r}")
            if lines:
                self.lines = _line_numbers(message.get("lines"))
            if "error" in message:
                for raw in ran:
                    raw.error = {**message["error"], "phase": "import"}
                return ran
            answers = message["cases"]
            if not isinstance(answers, list) or len(answers) != len(ran):
                raise ValueError("one answer per case expected")
            for raw, answer in zip(ran, answers, strict=True):
                _record_outputs(raw, answer, self)
        except ChildFailure as exc:
            for raw in ran:
                if raw.outputs is None and raw.error is None:
                    raw.failure = "timeout" if isinstance(exc, ChildTimeout) else "died"
                    raw.failure_detail, raw.log_tail = str(exc), exc.log_tail
            self.stop()
        except (ValueError, KeyError, TypeError, OSError) as exc:  # a forged or corrupt answer
            for raw in ran:
                raw.outputs = raw.error = None
                raw.failure, raw.failure_detail = "died", f"unusable screening answer: {exc!r}"
            self.stop()
        finally:
            path.unlink(missing_ok=True)
        return ran


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
