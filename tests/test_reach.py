"""Nudges (``forensics.reach``): when one case's numbers give no lead, the engine moves one input
element and compares which outputs move in the kernel and in the reference."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_playbook_holdout6 import HOLDOUT6
from test_playbook_shipped import SPECS, planted

from nearmiss.engine.check import check
from nearmiss.engine.forensics import reach
from nearmiss.engine.models import CaseResult, Localisation

NUDGE = reach.Nudge("base.nudge-x", ("compact", "base"), "x", 0, (1, 4))


def failing_case(name: str = "base", **loc) -> CaseResult:
    """A compact-suite case failing with wrong values, its output leaf ``out`` localised."""
    return CaseResult(
        suite="compact",
        name=name,
        dims={},
        dtype="float32",
        profile="normal",
        passed=False,
        failure_class="wrong_values",
        atol=1e-5,
        rtol=1e-5,
        localisation=Localisation(leaf="out", axes=[], **loc),
    )


def footprint(shape, *cells, between=()) -> np.ndarray:
    """A nudge's classes over an output: MOVED at ``cells``, BETWEEN at ``between``."""
    out = np.full(shape, reach.STILL, np.int8)
    for cell in between:
        out[cell] = reach.BETWEEN
    for cell in cells:
        out[cell] = reach.MOVED
    return out


def test_an_output_moves_when_it_changes_beyond_tolerance_and_by_a_share_of_itself():
    before = np.array([1.0, 1.0, 100.0, 0.0, 1.0])
    after = np.array([1.0 + 1e-6, 1.5, 100.5, 0.5, np.nan])
    got = reach.classes(before, after, atol=1e-4, rtol=1e-4)
    # within tolerance; 50 %; 0.5 % of 100 (beyond tolerance, not clearly moved); from zero; NaN
    assert got.tolist() == [reach.STILL, reach.MOVED, reach.BETWEEN, reach.MOVED, reach.MOVED]


def test_a_footprint_cut_to_its_own_element_names_the_missing_reduction():
    row = footprint((2, 8), (1, slice(None)))
    text = reach.describe(NUDGE, footprint((2, 8), (1, 4)), row, "out")
    assert text.startswith("Nudging x[1, 4] (up by 8 times its rms) moves 8 elements ([1, 0-7])")
    assert "of out in the reference and 1 element ([1, 4]) in the kernel" in text
    assert "carries x[1, 4] along output axis 1 and the kernel does not" in text
    # The kernel's own element barely moving (between) is still "touched": not "ignores".
    barely = footprint((2, 8), between=[(1, 4)])
    assert "along output axis 1 and the kernel does not" in reach.describe(NUDGE, barely, row)


def test_an_ignored_element_and_a_misdirected_one_are_told_apart():
    row = footprint((2, 8), (1, slice(None)))
    assert "the kernel ignores x[1, 4]" in reach.describe(NUDGE, footprint((2, 8)), row)
    both_rows = footprint((2, 8), (slice(None), slice(None)))
    said = reach.describe(NUDGE, both_rows, row)
    assert "to [0, 0-7], which the reference leaves alone" in said
    other_row = footprint((2, 8), (0, slice(None)))
    said = reach.describe(NUDGE, other_row, row)
    assert "to [0, 0-7] and not to [1, 0-7], where the reference does" in said
    assert reach.describe(NUDGE, row, row.copy()) is None  # the same footprint: no lead
    # One output of a wide footprint on the edge of the thresholds is no finding either.
    wide = footprint((2, 64), (1, slice(None)))
    assert reach.describe(NUDGE, footprint((2, 64), (1, slice(1, None))), wide) is None
    # Outputs that moved only a little on one side are no evidence either way.
    weak = footprint((2, 8), (1, slice(0, 6)), between=[(1, 6), (1, 7)])
    assert reach.describe(NUDGE, weak, row) is None


def test_only_a_wrong_values_case_without_a_lead_is_nudged_and_only_its_float_inputs():
    case = failing_case

    x, lengths = np.zeros((4, 6), np.float32), np.zeros(4, np.int32)
    inputs = [("x", x), ("lengths", lengths), ("w", np.zeros(6, np.float32))]
    planned = reach.candidates([case("base")], [inputs])
    assert [(n.input, n.position, n.index) for n in planned] == [("x", 0, (1, 4)), ("w", 2, (3,))]
    assert planned[0].request(case("base"))["nudge"] == {
        "of": ["compact", "base"],
        "input": 0,
        "index": [1, 4],
        "by": reach.NUDGE_BY,
    }
    assert reach.candidates([case("base", follows="The error follows ...")], [inputs]) == []
    # The longest axis gets nudges on either side of the edge of what the reference reads
    # (placed by the spec's child), then near its end, then near its start (padding past a
    # length, the blocks before the last), after the mid-axis ones; a short one none.
    long = [("x", np.zeros((4, 64), np.float32)), ("w", np.zeros(96, np.float32))]
    planned = reach.candidates([case("base")], [long])
    assert [(n.name, n.index, n.edge) for n in planned] == [
        ("base.nudge-x", (1, 42), None),
        ("base.nudge-w", (48,), None),
        ("base.nudge-w-edge-ignored", (48,), (0, "ignored")),
        ("base.nudge-w-edge-used", (48,), (0, "used")),
        ("base.nudge-w-end", (83,), None),
        ("base.nudge-w-start", (12,), None),
    ]
    assert planned[2].request(case("base"))["nudge"]["boundary"] == {"axis": 0, "side": "ignored"}
    short = [("x", np.zeros((4, 6), np.float32))]
    assert [n.name for n in reach.candidates([case("base")], [short])] == ["base.nudge-x"]


def test_an_unreduced_sum_of_squares_is_named_by_a_nudge_in_a_real_check(tmp_path: Path):
    """JAX's GPU rms norm with its lane accumulator never summed (holdout6): every element
    normalised by its own magnitude. The numbers alone said only "values are wrong"; the nudge
    runs the kernel once more and names the axis the reduction left out."""
    case = HOLDOUT6["rms_norm_sum_of_squares_unreduced"]
    candidate = tmp_path / "kernel.py"
    candidate.write_text(planted(case))
    report = check(SPECS / f"{case.spec}_spec.py", candidate, "compact", seed=3)
    failing = report.cases[0]
    assert report.failure_class == "wrong_values" and not report.certified
    said = failing.localisation.reach
    assert said and said.startswith("Nudging x[0, 4, 192] (up by 8 times its rms) moves 25")
    # The kernel moves the element's own output at most (a sign flip), the reference its row.
    assert re.search(
        r"of out in the reference and (0 elements|1 element \(\[0, 4, 192\]\)) in", said
    )
    assert "along output axis 2 and the kernel does not" in said
    assert said in failing.diagnosis and said in report.diagnosis
    # Evidence only: the nudges are not suite cases and certify nothing.
    assert [c.name for c in report.cases] == ["base"]


def test_a_second_nudge_is_asked_only_when_the_first_found_nothing():
    from types import SimpleNamespace as Raw

    x, w = np.arange(1.0, 13.0).reshape(3, 4), np.ones(4)
    out = x * w
    case = failing_case()
    info = Raw(suite="compact", name="base")
    base = Raw(info=info, outputs=[out], reference=[out], input_arrays=[("x", x), ("w", w)])

    def run(kernel, reference):
        return Raw(outputs=[kernel], reference=[reference])

    # The first nudge (x) moves the same outputs on both sides: the second (w) is asked.
    plan = reach.NudgePlan([case], [base])
    (first,) = plan.next({})
    assert first["nudge"]["input"] == 0
    moved_x = out.copy()
    moved_x[1, 2] += 8.0
    (second,) = plan.next({first["name"]: run(moved_x, moved_x)})
    assert second["nudge"]["input"] == 1
    # The second finds the kernel ignoring w: no third round, and the case says so.
    moved_w = out.copy()
    moved_w[:, 2] += 8.0
    assert (
        plan.next({first["name"]: run(moved_x, moved_x), second["name"]: run(out, moved_w)}) == []
    )
    plan.conclude([case], {})
    assert "the kernel ignores w[2], which the reference uses" in case.localisation.reach
    assert case.localisation.reach in case.diagnosis

    # An edge the spec's child could not place (no output of it, no edge told) drops its twin:
    # after the two mid-axis nudges and the unplaced edge, the next asked is the end nudge.
    long = np.zeros(64)
    wide = Raw(info=info, outputs=[out], reference=[out], input_arrays=[("x", x), ("w", long)])
    plan = reach.NudgePlan([case], [wide])
    asked = [plan.next({})[0]]
    same = {}
    for _ in range(2):
        same[asked[-1]["name"]] = run(out, out)
        asked.append(plan.next(same)[0])
    assert asked[-1]["nudge"]["boundary"]["side"] == "ignored"
    same[asked[-1]["name"]] = Raw(outputs=None, reference=[], nudged={})  # unrunnable
    (after,) = plan.next(same)
    assert after["name"].endswith("nudge-w-end") and "boundary" not in after["nudge"]

    # A first nudge that finds something ends the nudging.
    case.localisation.reach, case.diagnosis = None, ""
    plan = reach.NudgePlan([case], [base])
    (first,) = plan.next({})
    assert plan.next({first["name"]: run(out, moved_x)}) == []


def test_an_unchanged_inf_or_nan_did_not_move():
    before = np.array([np.inf, np.nan, -np.inf, 1.0])
    after = np.array([np.inf, np.nan, np.inf, 1.0])
    assert reach.classes(before, after, 1e-5, 1e-5).tolist() == [
        reach.STILL,
        reach.STILL,
        reach.MOVED,  # -Inf to Inf
        reach.STILL,
    ]


def test_a_nudge_keeps_its_input_s_dtype_and_type_and_stays_finite():
    """In the spec's child: a float32 input near its maximum (an adversarial profile) is nudged
    to at most a quarter of it, not to Inf; bfloat16 stays bfloat16; a NumPy float64 input stays
    a NumPy float64 array (a JAX array without x64 would be float32)."""
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp

    from nearmiss.engine.runner.reference_child import _draw

    drawn = (
        jnp.full((4, 4), 3e38, jnp.float32),
        jnp.ones((4, 4), jnp.bfloat16),
        np.ones(4, np.float64),
    )
    spec = SimpleNamespace(make_inputs=lambda case, key: drawn)
    suite = [("compact", SimpleNamespace(name="base"))]
    for position, index in ((0, [1, 2]), (1, [1, 2]), (2, [1])):
        nudge = {"of": ["compact", "base"], "input": position, "index": index, "by": 8.0}
        inputs, told = _draw(jax, np, spec, {"seed": 0}, {"nudge": nudge}, None, suite, {})
        assert told == {}  # nothing to tell of a nudge placed by the engine
        x, was = inputs[position], drawn[position]
        assert type(x) is type(was) and x.dtype == was.dtype
        wide = np.asarray(x, np.float64)
        assert np.isfinite(wide).all() and (wide != np.asarray(was, np.float64)).sum() == 1
    assert (
        float(_draw(jax, np, spec, {"seed": 0}, {"nudge": nudge}, None, suite, {})[0][2][1]) == 9.0
    )
    swap = {"of": ["compact", "base"], "swap": [0, 2]}
    swapped, _ = _draw(jax, np, spec, {"seed": 0}, {"nudge": swap}, None, suite, {})
    assert swapped[0] is drawn[2] and swapped[2] is drawn[0] and swapped[1] is drawn[1]


def test_inputs_the_kernel_takes_one_for_the_other_are_named_in_a_real_check(tmp_path: Path):
    """JAX's layer norm with weight and bias swapped (holdout4): its outputs are the
    reference's on the swapped inputs, which one more run with them swapped shows."""
    from test_playbook_holdout4 import HOLDOUT4

    case = HOLDOUT4["layer_norm_weight_bias_swapped"]
    candidate = tmp_path / "kernel.py"
    candidate.write_text(planted(case))
    report = check(SPECS / f"{case.spec}_spec.py", candidate, "compact", seed=3)
    said = report.cases[0].localisation.reach
    assert "The kernel's out is the reference's with weight and bias swapped (100.0%" in said
    assert "the kernel takes weight for bias and bias for weight" in report.diagnosis


def test_a_swap_is_named_only_when_the_swapped_reference_matches():
    swap = reach.Swap("base.swap-a-b", ("compact", "base"), ("a", "b"), (0, 1))
    case = failing_case()
    a, b = np.arange(8.0), np.arange(8.0) * 3 + 1
    kernel, reference = [b - a], [a - b]  # the kernel computes b - a for a - b
    said = reach.swap_sentence(swap, case, (kernel, reference), ([a - b], [b - a]))
    assert said.startswith("The kernel's out is the reference's with a and b swapped (100.0%")
    assert "0.0% of the reference as called" in said
    # A swapped reference as wrong as the plain one: no finding.
    assert reach.swap_sentence(swap, case, (kernel, reference), ([a - b], [b + a])) is None


def test_the_spec_s_child_finds_the_edge_of_what_the_reference_reads():
    """``reference_child._edge``, from the reference's gradient: a length mask's bound, a
    window's lower edge (the first change along the axis), none for a reference that reads
    every position or one whose unread positions are scattered (an elementwise relu)."""
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp

    from nearmiss.engine.runner.reference_child import _draw, _edge

    x = jax.random.normal(jax.random.PRNGKey(1), (3, 40), jnp.float32)
    inputs = [x, jnp.ones(3, jnp.float32)]

    def spec(reference):
        return SimpleNamespace(reference=reference, make_inputs=lambda case, key: tuple(inputs))

    def length_masked(x, w):  # keys 0..29 of 40
        return jnp.sum(jnp.where(jnp.arange(40) < 30, x, 0.0), axis=1) * w

    def window(x, w):  # keys 10..29
        keep = (jnp.arange(40) >= 10) & (jnp.arange(40) < 30)
        return jax.nn.softmax(jnp.where(keep, x, -jnp.inf), axis=1) * w[:, None]

    assert _edge(jax, np, spec(length_masked), inputs, 0, 1) == (29, 30)
    assert _edge(jax, np, spec(window), inputs, 0, 1) == (10, 9)
    for reads_all_or_scattered in (lambda x, w: x.sum(1) * w, lambda x, w: jax.nn.relu(x[0])):
        with pytest.raises(ValueError, match="no single edge"):
            _edge(jax, np, spec(reads_all_or_scattered), inputs, 0, 1)
    # A nudge asked at the edge lands there, and the child says where.
    nudge = {"of": ["compact", "base"], "input": 0, "index": [1, 20], "by": 8.0}
    nudge["boundary"] = {"axis": 1, "side": "ignored"}
    suite = [("compact", SimpleNamespace(name="base"))]
    drawn, told = _draw(
        jax, np, spec(length_masked), {"seed": 0}, {"nudge": nudge}, None, suite, {}
    )
    assert told == {"index": [1, 30], "used": 29, "ignored": 30}
    moved = np.nonzero(np.asarray(drawn[0]) != np.asarray(x))
    assert [int(i) for i in np.concatenate(moved)] == [1, 30]


def test_the_edge_is_found_once_per_check_and_for_a_reference_only_eager_mode_runs():
    """Both sides of an edge are asked in two control rounds of one check: the reference is
    differentiated once, and its compiled gradient serves the next check of those shapes. A
    reference that reads a value with ``int`` (no single compiled program can) is
    differentiated op by op, its edge found the same, without another compile tried."""
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp

    from nearmiss.engine.runner.reference_child import _draw, _edge

    x = jax.random.normal(jax.random.PRNGKey(1), (3, 40), jnp.float32)
    calls = []

    def masked(x):  # keys 0..29 of 40
        calls.append(1)
        return jnp.sum(jnp.where(jnp.arange(40) < 30, x, 0.0), axis=1)

    def concrete_only(x):  # the same; x is never that large
        calls.append(1)
        return jnp.sum(x[:, : 30 + int(x[0, 0] > 1e9)], axis=1)

    suite = [("compact", SimpleNamespace(name="base"))]
    for reference, traced in ((masked, 1), (concrete_only, 2)):
        calls.clear()
        spec = SimpleNamespace(reference=reference, make_inputs=lambda case, key: (x,))
        edges: dict = {}  # one check's control rounds
        for side, index in (("ignored", 30), ("used", 29)):
            nudge = {"of": ["compact", "base"], "input": 0, "index": [1, 5], "by": 8.0}
            nudge["boundary"] = {"axis": 1, "side": side}
            _, told = _draw(jax, np, spec, {"seed": 0}, {"nudge": nudge}, None, suite, edges)
            assert told == {"index": [1, index], "used": 29, "ignored": 30}
        # Once for both sides: compiled, or a failed compile and op by op.
        assert len(calls) == traced, reference.__name__
        calls.clear()
        assert _edge(jax, np, spec, [x * 2], 0, 1) == (29, 30)  # the next check
        assert len(calls) == (0 if reference is masked else 1), reference.__name__


def test_a_window_mask_read_past_its_edge_is_named_in_a_real_check(tmp_path: Path):
    """JAX's GPU decode attention with the window's two bounds joined by | (holdout10): every
    key of the split holding key 300 is attended, the padding too. The error is everywhere, the
    blind nudges (mid-axis) move the same outputs on both sides; the nudge the spec's child
    places past the reference's own edge (key 300 of 512) shows the kernel reading it."""
    from test_playbook_holdout10 import HOLDOUT10

    case = HOLDOUT10["decode_window_mask_or"]
    candidate = tmp_path / "kernel.py"
    candidate.write_text(planted(case))
    report = check(SPECS / f"{case.spec}_spec.py", candidate, "compact", seed=3)
    said = report.cases[0].localisation.reach
    assert said.startswith(
        "The edge of what the reference reads of k along axis 1: position 299 is read, 300 is"
        " not. Nudging k[0, 300, 48] (up by 8 times its rms) moves 0 elements of out in the"
        " reference"
    )
    assert "the kernel carries k[0, 300, 48] to [0, " in said and said in report.diagnosis
    assert [c.name for c in report.cases] == ["base"] and not report.certified
