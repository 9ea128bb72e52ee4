"""Sandbox child that screens many edits of one kernel: JAX imported once, the edits taken a
batch at a time.

Each ``screen`` request names the case directories (``inputs.npz`` in each, filed by the spec's
child for a baseline run) and, per case, the programs the engine has already judged (``known``);
the batch's edits follow one ``edit`` message each (the engine screens the next one statically
while this child traces the last), then ``run``. The child imports each edit as a module of its
own and traces its ``kernel`` on every case's inputs, telling the engine as each edit is traced
(a trace that hangs is that edit's own); then it compiles the programs left to run as one XLA
program, runs it once (interpret mode on CPU, as everywhere), files each output under the name
the edit's message gives and reports per case; the engine compares (``runner.edit_screen``).
Compiled together, a batch's programs cost a fraction of what they cost one by one (the
compiler's fixed costs, and the parts the mutants share, are paid once: eight mutants of JAX's
layer norm compiled in a third of the time), and their outputs are bit for bit those of each
program compiled alone. Where the joint compile
or run raises, each half is tried so, down to a program alone, so that each error is its own
edit's.

Each traced program is keyed (``program``, ``runner.program_key``: the jaxpr walked in full).
Many mutants trace to the same program (a branch the suite's inputs never take, a value no
output depends on): one the engine already judged on that case, or one an earlier edit of the
batch runs, is not compiled nor run again; its answer says ``known`` and the engine takes the
verdict it gave that program.

Asked to (``lines``, with a batch of one edit), it also reports which lines of the edit's file
ran (a line tracer on that file alone): the engine skips edits of code the failing suite never
runs. Untrusted code runs here and nothing it does certifies: screening only ranks edits, and
a kernel that hides its lines, or names a program it does not have, only misleads its own
repair.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.candidate_child import import_candidate
from nearmiss.engine.runner.child import Channel, describe_exception, start_child
from nearmiss.engine.runner.cpu_compile import compile_lowered
from nearmiss.engine.runner.program_key import program_key

CLEAR_EVERY = 16  # edits between clearing JAX's caches: the child's memory stays flat
_inputs: dict[str, list[Any]] = {}  # case directory -> its inputs (NumPy), read once per child


def _import_edit(path: str, index: int):
    return import_candidate(path, f"nearmiss_edit_{index}")


def _case_inputs(case_dir: str) -> list[Any]:
    from nearmiss.engine.runner.arrays import load_arrays

    if case_dir not in _inputs:
        _inputs[case_dir] = load_arrays(Path(case_dir) / "inputs.npz")[0]
    return _inputs[case_dir]


class _Case:
    """One case of one edit: its answer to the engine, and what is needed to run it."""

    def __init__(self, edit: _Edit, position: int, case_dir: str, args: list[Any]) -> None:
        self.edit, self.position, self.case_dir, self.args = edit, position, case_dir, args
        self.answer: dict[str, Any] = {}
        self.traced: Any = None  # where the trace succeeded

    def trace(self) -> None:
        try:
            self.traced = self.edit.jitted.trace(*self.args)
        except (Exception, SystemExit) as exc:
            self.answer.update(ok=False, error=describe_exception(exc, "trace"))
            return
        self.answer["program"] = program_key(self.traced.jaxpr, self.traced.out_tree)

    def file(self, output: Any) -> None:
        """File the run's output as the edit's output file; an error of the filing is the run's."""
        import jax
        import numpy as np

        from nearmiss.engine.runner.arrays import save_arrays

        try:
            leaves, treedef = jax.tree_util.tree_flatten(output)
            save_arrays(Path(self.case_dir) / self.edit.output, [np.asarray(x) for x in leaves])
            self.answer.update(ok=True, treedef=str(treedef))
        except (Exception, SystemExit) as exc:
            self.answer.update(ok=False, error=describe_exception(exc, "run"))

    def run_alone(self) -> None:
        import jax

        phase = "compile"  # lowering belongs to the compile, as in a check's stages
        try:
            compiled = compile_lowered(self.traced.lower())
            phase = "run"
            output = jax.block_until_ready(compiled(*self.args))
        except (Exception, SystemExit) as exc:
            self.answer.update(ok=False, error=describe_exception(exc, phase))
            return
        self.file(output)


class _Edit:
    def __init__(self, request: dict[str, Any]) -> None:
        self.index: int = request["index"]
        self.path: str = request["path"]
        self.output: str = request["output"]
        self.jitted: Any = None
        self.error: dict[str, Any] | None = None  # of its import
        self.cases: list[_Case] = []

    def trace(self, case_dirs: list[str], inputs: list[list[Any]]) -> None:
        import jax

        try:
            kernel = getattr(_import_edit(self.path, self.index), "kernel", None)
            if not callable(kernel):
                raise AttributeError("the edit defines no callable `kernel`")
        except (Exception, SystemExit) as exc:  # the import: a case's own failure is its answer
            self.error = describe_exception(exc, "import")
            return
        self.jitted = jax.jit(kernel)
        for position, (case_dir, args) in enumerate(zip(case_dirs, inputs, strict=True)):
            case = _Case(self, position, case_dir, args)
            case.trace()
            self.cases.append(case)

    def answer(self) -> dict[str, Any]:
        if self.error is not None:
            return {"index": self.index, "error": self.error}
        return {"index": self.index, "cases": [case.answer for case in self.cases]}


def _run_together(cases: list[_Case], inputs: list[list[Any]]) -> None:
    """Each case's program run on its inputs (``inputs``, by the case's position), and its
    output filed: compiled as one program where that compiles and runs, else each half so,
    down to a program alone, whose error is then its own."""
    import jax

    if len(cases) == 1:
        cases[0].run_alone()
    if len(cases) <= 1:
        return
    args = [a for case_inputs in inputs for a in case_inputs]
    starts = [0]
    for case_inputs in inputs:
        starts.append(starts[-1] + len(case_inputs))

    def together(*flat):
        return [
            case.edit.jitted(*flat[starts[case.position] : starts[case.position + 1]])
            for case in cases
        ]

    try:
        compiled = compile_lowered(jax.jit(together).trace(*args).lower())
        outputs = jax.block_until_ready(compiled(*args))
    except (Exception, SystemExit):  # a program's failure: the halves tell which
        half = len(cases) // 2
        _run_together(cases[:half], inputs)
        _run_together(cases[half:], inputs)
        return
    for case, output in zip(cases, outputs, strict=True):
        case.file(output)


@contextlib.contextmanager
def _lines_of(path: str, lines: set[int]) -> Iterator[None]:
    """Collect into ``lines`` the lines of ``path`` that run, in this thread and in threads
    started meanwhile (a callback's). Other files' frames are not traced line by line."""

    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def calls(frame, event, arg):
        if frame.f_code.co_filename != path:
            return None
        lines.add(frame.f_lineno)
        return local

    sys.settrace(calls)
    threading.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]


def screen_batch(request: dict[str, Any], channel: Channel) -> dict[str, Any] | None:
    """The batch's edits as the engine sends them (``edit``), each traced at once (an
    ``edit_traced`` message each); at ``run``, the programs neither known nor run by an
    earlier edit of the batch run together; the answers. None: the engine sent neither."""
    import jax.numpy as jnp

    case_dirs: list[str] = request["cases"]
    known = [set(programs) for programs in request["known"]]
    # One set of arrays per case for the batch: an edit's Python sees only tracers of them.
    inputs = [[jnp.asarray(a) for a in _case_inputs(d)] for d in case_dirs]
    edits: list[_Edit] = []
    to_run: list[_Case] = []
    lines: set[int] = set()
    try:
        with contextlib.ExitStack() as traced:
            while (message := channel.receive()).get("cmd") == "edit":
                edit = _Edit(message)
                if request.get("lines") and not edits:
                    traced.enter_context(_lines_of(edit.path, lines))
                edits.append(edit)
                edit.trace(case_dirs, inputs)
                for position, case in enumerate(edit.cases):
                    program = case.answer.get("program")
                    if case.traced is None:
                        continue  # its trace failed: the error is its answer
                    if program is not None and program in known[position]:
                        case.answer["known"] = True
                        continue
                    if program is not None:
                        known[position].add(program)  # a later edit of the batch reuses it
                    to_run.append(case)
                channel.send(event="edit_traced", index=edit.index)
            if message.get("cmd") != "run":
                return None
            _run_together(to_run, inputs)
    finally:
        for edit in edits:
            sys.modules.pop(f"nearmiss_edit_{edit.index}", None)
    answer: dict[str, Any] = {"event": "batch_done", "edits": [e.answer() for e in edits]}
    if request.get("lines"):
        answer["lines"] = sorted(lines)
    return answer


def main() -> None:
    channel = start_child()
    import jax

    from nearmiss.engine.runner.interpret import force_interpret_on_cpu

    channel.send(event="ready", platform=force_interpret_on_cpu(), jax_version=jax.__version__)
    done = 0
    while (request := channel.receive()).get("cmd") == "screen":
        answer = screen_batch(request, channel)
        if answer is None:
            break
        channel.send(**answer)
        before, done = done, done + len(answer["edits"])
        if done // CLEAR_EVERY > before // CLEAR_EVERY:
            # Edits' compiled programs are of no use to later edits; clearing after each one
            # would also drop the programs every edit shares (a quarter of the child's speed).
            jax.clear_caches()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
