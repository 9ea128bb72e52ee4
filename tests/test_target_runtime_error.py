"""A kernel that raises under a target's semantics: the report names the exception.

JAX's TPU interpret mode runs the kernel's block reads in a callback; an exception there comes
back wrapped in a runtime error whose message is the callback's whole traceback. Its first line
is ``Traceback (most recent call last):``, which says nothing; its last line says what broke.
"""

from __future__ import annotations

import json

import pytest

from conftest import PLANTED, run_cli
from nearmiss.engine.errors import exception_line

PAST_THE_END = PLANTED / "tpu_block_past_the_end.py"
DOUBLE_SPEC = PLANTED / "tpu_spec" / "spec.py"
# What TPU interpret mode says of the planted kernel's extra row of blocks.
RAISED = "IndexError: Out-of-bounds block index (8, 0)"

WRAPPED = (
    "INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n"
    '  File "/x/jax/_src/callback.py", line 816, in _wrapped_callback\n'
    '  File "/x/interpret_pallas_call.py", line 671, in get\n'
    'IndexError: Out-of-bounds block index (3, -1, 0) for input "x_ref"\n'
    "--------------------\n"
    "For simplicity, JAX has removed its internal frames from the traceback of the following "
    "exception. Set JAX_TRACEBACK_FILTERING=off to include these.\n"
)


@pytest.mark.parametrize(
    ("kind", "message", "line"),
    [
        (
            "JaxRuntimeError",
            WRAPPED,
            'IndexError: Out-of-bounds block index (3, -1, 0) for input "x_ref"',
        ),
        ("ValueError", "bad block\nmore detail", "ValueError: bad block"),
        ("RuntimeError", "Traceback (most recent call last):\n", "RuntimeError"),
        ("KeyError", "", "KeyError"),
    ],
)
def test_an_exception_is_summarised_by_the_line_that_says_what_broke(kind, message, line):
    assert exception_line(kind, message) == line


def test_a_target_runtime_error_names_the_exception_in_text_and_json():
    args = ("check", DOUBLE_SPEC, PAST_THE_END, "--seed", "1", "--no-controls")
    as_json = run_cli(*args, "--json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert all(case["passed"] for case in report["cases"])  # clamped: right in program order
    tpu = report["targets"]["tpu-v5e"]
    assert tpu["failure_class"] == "runtime_error"
    assert RAISED in tpu["error"] and "Traceback" not in tpu["error"], tpu["error"]
    assert RAISED in report["diagnosis"] and "Traceback" not in report["diagnosis"]
    text = run_cli(*args)
    assert text.returncode == 1, text.stderr
    assert f"it raised under TPU semantics: {RAISED}" in text.stdout, text.stdout
    assert "Traceback" not in text.stdout
