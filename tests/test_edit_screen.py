"""The search's warm screening child (``nearmiss.engine.runner.edit_screen``): many edits of one
kernel in one sandbox child, compared by the engine against a baseline run's references.

Real children, real sandbox: the fixed edit passes and the broken one fails; edits that trace to
one program run it once, and edits whose programs differ (a number, the input read) each run
theirs; an edit that hangs, in its trace or in the batch's run, costs its timeout and the others
of its batch are still judged; an edit that writes outside its sandbox leaves no file behind; a
child's state does not let a later edit pass.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from nearmiss.engine.check import case_result, check
from nearmiss.engine.runner.edit_screen import EditScreen
from nearmiss.engine.runner.sandbox import Limits
from nearmiss.engine.runner.session import run_sandboxed
from nearmiss.engine.targets.registry import DEFAULT_TARGETS

HERE = Path(__file__).parent / "search"
SPEC = HERE / "axpy_spec.py"
SWAPPED = (HERE / "axpy_swapped_refs.py").read_text()
FIXED = SWAPPED.replace(
    "def _axpy_body(y_ref, x_ref, o_ref):", "def _axpy_body(x_ref, y_ref, o_ref):"
)


def _screen(tmp_path: Path, limits: Limits) -> EditScreen:
    kernel = tmp_path / "kernel.py"
    kernel.write_text(SWAPPED)
    inputs = tmp_path / "inputs"
    baseline = run_sandboxed(
        SPEC, kernel, "all", 1, limits, audit=False, targets=DEFAULT_TARGETS, inputs_to=inputs
    )
    assert len(baseline.cases) == 2 and sorted(p.name for p in inputs.iterdir())
    return EditScreen(baseline, inputs, limits)


def _passed(ran) -> list[bool]:
    return [case_result(getattr(raw, "raw", raw), "kernel.py").passed for raw in ran]


def test_edits_that_trace_to_one_program_run_it_once(tmp_path):
    """A constant nothing reads, a comment: the program is the same, and only its first edit
    runs it; the others are answered ``known``, in the batch and in later batches told what
    the engine judged. An edit that changes a number, or that reads the other input where an
    edit read one (programs alike but for which input they read), runs its own."""
    unread = FIXED + "\nUNUSED = 0.25\n"
    halved = FIXED.replace("0.5 * y_ref", "0.25 * y_ref")
    reads_x = FIXED + "\n\ndef kernel(x, y):\n    return x * 0.5\n"
    reads_y = FIXED + "\n\ndef kernel(x, y):\n    return y * 0.5\n"
    screen = _screen(tmp_path, Limits(case_timeout_s=30))
    try:
        batch = [(0, FIXED), (1, unread), (2, halved), (3, reads_x), (4, reads_y)]
        first = screen.judge_batch(batch, {})
        assert [[case.known for case in first[index]] for index, _ in batch] == [
            [False, False],
            [True, True],
            [False, False],
            [False, False],
            [False, False],
        ]
        assert [c.program for c in first[1]] == [c.program for c in first[0]]
        assert _passed(first[0]) == [True, True] and _passed(first[2]) == [False, False]
        assert not np.array_equal(first[3][0].raw.outputs[0], first[4][0].raw.outputs[0])
        alone = screen.judge(5, halved)  # compiled alone, the same numbers as in the batch
        for raw, batched in zip(alone, first[2], strict=True):
            assert np.array_equal(raw.outputs[0], batched.raw.outputs[0])
        known = {case.raw.info.key: {case.program} for case in first[0]}
        commented = FIXED.replace("BLOCK_ROWS = 32", "BLOCK_ROWS = 32  # a block's rows")
        assert all(case.known for case in screen.judge_batch([(6, commented)], known)[6])
        assert not any(case.known for case in screen.judge_batch([(7, halved)], known)[7])
    finally:
        screen.stop()


def test_edits_share_a_child_and_are_judged_by_the_engine(tmp_path):
    screen = _screen(tmp_path, Limits(case_timeout_s=30))
    try:
        assert _passed(screen.judge(0, SWAPPED)) == [False, False]
        assert _passed(screen.judge(1, FIXED)) == [True, True]
        first = screen.child
        broken = FIXED.replace("0.5 * y_ref", "0.25 * y_ref")
        assert _passed(screen.judge(2, broken)) == [False, False]
        assert screen.child is first  # one warm child served all three
        crashing = FIXED.replace(
            "def kernel(x, y):", "def kernel(x, y):\n    raise ValueError('no')"
        )
        ran = screen.judge(3, crashing)
        assert all(r.error and "no" in r.error["message"] for r in ran)
    finally:
        screen.stop()


def test_the_lines_a_kernel_runs_are_reported_and_no_others(tmp_path):
    """The line tracer sees the kernel's import and its run (the body traced by Pallas), and
    not a function the run never calls."""
    source = FIXED + "\n\ndef _never(x):\n    return x * 3.0\n"
    lines = source.splitlines()
    screen = _screen(tmp_path, Limits(case_timeout_s=30))
    try:
        ran = screen.lines_run(source)
        assert _passed(screen.judge(0, FIXED)) == [True, True]  # the child serves edits after
    finally:
        screen.stop()
    assert ran is not None
    assert lines.index("    o_ref[...] = x_ref[...] - 0.5 * y_ref[...]") + 1 in ran
    assert lines.index("    rows, cols = x.shape") + 1 in ran
    assert lines.index("def _never(x):") + 1 in ran  # the def statement runs at import
    assert lines.index("    return x * 3.0") + 1 not in ran


def test_a_program_that_fails_in_its_batch_is_told_apart_from_the_others(tmp_path):
    """One program raises at run time (a host callback that raises): the batch's joint run
    fails, its halves are tried, and only that edit's cases carry the error."""
    raising = FIXED.replace(
        "def kernel(x, y):",
        "def _no(x):\n    raise ValueError('no')\n\n\ndef kernel(x, y):\n"
        "    jax.debug.callback(_no, x)",
    )
    broken = FIXED.replace("0.5 * y_ref", "0.25 * y_ref")
    screen = _screen(tmp_path, Limits(case_timeout_s=30))
    try:
        ran = screen.judge_batch([(0, FIXED), (1, broken), (2, raising), (3, FIXED + "#")], {})
        assert _passed(ran[0]) == [True, True] and _passed(ran[1]) == [False, False]
        assert [case.raw.error["phase"] for case in ran[2]] == ["run", "run"]
        assert all(case.known for case in ran[3])
    finally:
        screen.stop()


def test_an_edit_that_hangs_in_its_trace_costs_its_timeout_and_its_batch_goes_on(tmp_path):
    # The allowance for starting JAX is long, and is the child's own: an edit, imported into a
    # child that is ready, is bounded by the candidate's limits without it.
    limits = Limits(case_timeout_s=3, startup_allowance_s=60)
    screen = _screen(tmp_path, limits)
    try:
        hanging = FIXED.replace("def kernel(x, y):", "def kernel(x, y):\n    while True: pass")
        broken = FIXED.replace("0.5 * y_ref", "0.25 * y_ref")
        screen.start()  # the child's own start-up, with its allowance, is not timed below
        first = screen.child
        started = time.monotonic()
        ran = screen.judge_batch([(0, FIXED), (1, hanging), (2, broken)], {})
        assert time.monotonic() - started < limits.startup_allowance_s
        assert [case.raw.failure for case in ran[1]] == ["timeout", "timeout"]
        assert _passed(ran[0]) == [True, True] and _passed(ran[2]) == [False, False]
        assert screen.child is not None and screen.child is not first  # a fresh one
    finally:
        screen.stop()


def test_an_edit_whose_program_never_ends_is_told_apart_from_its_batch(tmp_path):
    """A loop without end in the compiled program: the batch's run times out, and its edits
    are screened again one at a time, so the timeout is that edit's alone."""
    spinning = FIXED.replace(
        "    o_ref[...] = x_ref[...] - 0.5 * y_ref[...]",
        "    o_ref[...] = jax.lax.while_loop(lambda v: v[0, 0] == v[0, 0], lambda v: v + 1.0,"
        " x_ref[...])",
    )
    screen = _screen(tmp_path, Limits(case_timeout_s=3, startup_allowance_s=30))
    try:
        ran = screen.judge_batch([(0, FIXED), (1, spinning)], {})
        assert _passed(ran[0]) == [True, True]
        assert [case.raw.failure for case in ran[1]] == ["timeout", "timeout"]
    finally:
        screen.stop()


def test_an_edit_cannot_write_outside_its_sandbox(tmp_path):
    marker = tmp_path / "escaped"
    escaping = FIXED.replace(
        "def kernel(x, y):",
        f"try:\n    open({str(marker)!r}, 'w').write('x')\nexcept OSError:\n    pass\n\n\n"
        "def kernel(x, y):",
    )
    screen = _screen(tmp_path, Limits(case_timeout_s=30))
    try:
        assert _passed(screen.judge(0, escaping)) == [True, True]
        assert not marker.exists()
    finally:
        screen.stop()


def test_state_one_edit_leaves_in_the_child_can_fool_screening_but_never_the_check(tmp_path):
    """Edits share a child, so an edit can leave a later one what it needs to pass (here the
    right factor, a module attribute). That may mislead the ranking; the certificate comes from
    a check in fresh children, which refuses the later edit."""
    setter = FIXED.replace(
        "def kernel(x, y):", "import builtins\n\nbuiltins.HALF = 0.5\n\n\ndef kernel(x, y):"
    )
    rider = FIXED.replace("import jax\n", "import builtins\n\nimport jax\n", 1).replace(
        "0.5 * y_ref", "getattr(builtins, 'HALF', 0.25) * y_ref"
    )
    screen = _screen(tmp_path, Limits(case_timeout_s=30))
    try:
        assert _passed(screen.judge(0, rider)) == [False, False]
        screen.judge(1, setter)
        assert _passed(screen.judge(2, rider)) == [True, True]  # fooled by edit 1's state
    finally:
        screen.stop()
    candidate = tmp_path / "rider.py"
    candidate.write_text(rider)
    assert not check(SPEC, candidate, "all", 1).certified
