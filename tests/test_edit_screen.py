"""The search's warm screening child (``nearmiss.engine.runner.edit_screen``): many edits of one
kernel in one sandbox child, compared by the engine against a baseline run's references.

Real children, real sandbox: the fixed edit passes and the broken one fails; an edit that hangs
costs its timeout and the next edit still runs in a fresh child; an edit that writes outside its
sandbox leaves no file behind; a child's state does not let a later edit pass.
"""

from __future__ import annotations

from pathlib import Path

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
    return [case_result(raw, "kernel.py").passed for raw in ran]


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


def test_a_hanging_edit_costs_its_timeout_and_the_next_runs_in_a_new_child(tmp_path):
    screen = _screen(tmp_path, Limits(case_timeout_s=3, startup_allowance_s=30))
    try:
        hanging = FIXED.replace("def kernel(x, y):", "def kernel(x, y):\n    while True: pass")
        ran = screen.judge(0, hanging)
        assert [r.failure for r in ran] == ["timeout", "timeout"]
        assert screen.child is None
        assert _passed(screen.judge(1, FIXED)) == [True, True]
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
