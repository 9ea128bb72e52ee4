"""Sandbox child that screens many edits of one kernel: JAX imported once, each edit run on
the failing suite's inputs in turn.

Each ``screen`` request names one edit's file and the case directories (``inputs.npz`` in
each, filed by the spec's child for a baseline run). The child imports the edit as a module of
its own, runs its ``kernel`` on every case (interpret mode on CPU, as everywhere), files each
output as ``output.npz`` and reports per case; the engine compares (``runner.edit_screen``).
Asked to (``lines``), it also reports which lines of the edit's file ran (a line tracer on that
file alone): the engine skips edits of code the failing suite never runs. Untrusted code runs
here and nothing it does certifies: screening only ranks edits, and a kernel that hides its
lines only hides them from its own repair.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from nearmiss.engine.runner.candidate_child import Stages, import_candidate
from nearmiss.engine.runner.child import describe_exception, start_child
from nearmiss.engine.runner.protocol import OUTPUT_FILE

CLEAR_EVERY = 16  # edits between clearing JAX's caches: the child's memory stays flat


def _import_edit(path: str, index: int):
    return import_candidate(path, f"nearmiss_edit_{index}")


def _run_case(kernel, case_dir: Path) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from nearmiss.engine.runner.arrays import load_arrays, save_arrays

    result: dict = {}
    stages = Stages()
    try:
        inputs, _ = load_arrays(case_dir / "inputs.npz")
        _, output = stages.run(kernel, [jnp.asarray(a) for a in inputs], result)
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / OUTPUT_FILE, [np.asarray(leaf) for leaf in leaves])
        result.update(ok=True, treedef=str(treedef))
    except (Exception, SystemExit) as exc:
        result.update(ok=False, error=describe_exception(exc, stages.phase))
    return result


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


def screen_edit(request: dict) -> dict:
    answer: dict = {"event": "edit_done", "index": request["index"]}
    lines: set[int] = set()
    traced = _lines_of(request["path"], lines) if request.get("lines") else contextlib.nullcontext()
    try:
        with traced:
            kernel = getattr(_import_edit(request["path"], request["index"]), "kernel", None)
            if not callable(kernel):
                raise AttributeError("the edit defines no callable `kernel`")
            answer["cases"] = [_run_case(kernel, Path(d)) for d in request["cases"]]
    except (Exception, SystemExit) as exc:  # the import: a case's own failure is its answer
        answer["error"] = describe_exception(exc, "import")
    finally:
        sys.modules.pop(f"nearmiss_edit_{request['index']}", None)
    if request.get("lines"):
        answer["lines"] = sorted(lines)
    return answer


def main() -> None:
    channel = start_child()
    import jax

    from nearmiss.engine.runner.interpret import force_interpret_on_cpu

    channel.send(event="ready", platform=force_interpret_on_cpu(), jax_version=jax.__version__)
    for done in itertools.count(1):
        request = channel.receive()
        if request.get("cmd") != "screen":
            break
        channel.send(**screen_edit(request))
        if done % CLEAR_EVERY == 0:
            # Edits' compiled programs are of no use to later edits; clearing after each one
            # would also drop the programs every edit shares (a quarter of the child's speed).
            jax.clear_caches()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
