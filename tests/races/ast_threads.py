"""Threads building Python ASTs at once, provoked: ``python ast_threads.py MODE SECONDS``.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state; a thread
switch in the middle of one construction (here: a collection running ``__del__``, with the
switch interval near zero) lets another thread's construction change it, and one of them fails
with ``SystemError: AST constructor recursion depth mismatch``. Two threads read an ``.npz``
(NumPy parses its headers with ``ast.literal_eval``) while a third parses source.

MODE ``engine``: the engine's ``parse_source`` and ``load_arrays``, which share ``AST_LOCK``.
MODE ``bare``: ``ast.parse`` and ``np.load`` without it, the control. Runs until the first
``SystemError`` or SECONDS, and prints ``{"errors": [...], "parses": N, "loads": M}``.
"""

import ast
import gc
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from nearmiss.engine.inputs import parse_source
from nearmiss.engine.runner.arrays import load_arrays, save_arrays

MODE, SECONDS = sys.argv[1], float(sys.argv[2])
SOURCE = "\n".join(
    f"def f{i}(a, b):\n    return [x * (a + b) for x in range({i})] + [{{'k': (1, 2)}}]"
    for i in range(300)
)


class Garbage:
    def __del__(self) -> None:
        sum(range(50))  # Python code run by the collector: a chance to switch threads


def churn() -> None:
    first, second = Garbage(), Garbage()
    first.other, second.other = second, first  # a cycle: only the collector frees it


def bare_load(path: Path) -> None:
    with np.load(path, allow_pickle=False) as data:
        for name in data.files:
            data[name]


def main() -> None:
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    parse = parse_source if MODE == "engine" else ast.parse
    load = load_arrays if MODE == "engine" else bare_load
    errors: list[str] = []
    counts = {"parses": 0, "loads": 0}
    deadline = time.monotonic() + SECONDS

    def loop(step, counter: str) -> None:
        while time.monotonic() < deadline and not errors:
            churn()
            try:
                step()
            except SystemError as exc:
                errors.append(str(exc))
            counts[counter] += 1

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "arrays.npz"
        save_arrays(path, [np.zeros((4, 4), np.float32)] * 8)
        threads = [threading.Thread(target=loop, args=(lambda: parse(SOURCE), "parses"))]
        threads += [
            threading.Thread(target=loop, args=(lambda: load(path), "loads")) for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(json.dumps({"errors": errors[:1], **counts}))


if __name__ == "__main__":
    main()
