"""Forensics on synthetic outputs: comparison, localisation and classification, no sandbox."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nearmiss.engine.check import case_tolerance_used
from nearmiss.engine.forensics.classify import (
    classify_numeric,
    describe_numeric,
    describe_run,
    ranked_classes,
    refine_unstable,
)
from nearmiss.engine.forensics.compare import compare_leaf, structure_difference
from nearmiss.engine.forensics.errors import summarise_error
from nearmiss.engine.forensics.localise import index_ranges, localise
from nearmiss.engine.models import CaseResult
from nearmiss.engine.runner.arrays import load_arrays, save_arrays

RNG = np.random.default_rng(0)
REF = RNG.standard_normal((45, 320)).astype(np.float32)
GEOMETRY = [{"grid": [6], "outputs": [{"array_shape": [45, 320], "block_shape": [8, 320]}]}]


def classify(out, ref=REF, geometry=GEOMETRY, atol=1e-5, rtol=1e-5):
    comparison = compare_leaf("out", ref, out, atol, rtol)
    loc = localise("out", comparison.bad, geometry)
    return classify_numeric(comparison.stats, loc), comparison.stats, loc


def test_identical_outputs_have_no_mismatch():
    comparison = compare_leaf("out", REF, REF.copy(), 1e-5, 1e-5)
    assert comparison.stats.mismatched == 0
    assert comparison.stats.max_abs_error == 0


def test_nan_where_reference_is_nan_is_not_a_mismatch():
    ref = REF.copy()
    ref[0, 0] = np.nan
    ref[1, 1] = np.inf
    out = ref.copy()
    assert compare_leaf("out", ref, out, 1e-5, 1e-5).stats.mismatched == 0
    out[1, 1] = -np.inf
    assert compare_leaf("out", ref, out, 1e-5, 1e-5).stats.mismatched == 1


def test_tolerance_is_atol_plus_rtol_times_reference():
    ref = np.array([1.0, 100.0], np.float32)
    out = ref + np.array([0.5, 0.5], np.float32)
    stats = compare_leaf("out", ref, out, atol=0.1, rtol=0.01).stats
    # |0.5| > 0.1 + 0.01*1 fails; |0.5| <= 0.1 + 0.01*100 passes.
    assert stats.mismatched == 1 and stats.worst_index == [0]


def test_tolerance_used_is_the_largest_share_of_the_allowance():
    # allowance = atol + rtol*|ref| = 0.1 + 0.01*|ref|: 0.2 and 1.1 for these references.
    ref = np.array([10.0, 100.0], np.float64)
    half = compare_leaf("out", ref, ref + np.array([0.1, 0.55]), atol=0.1, rtol=0.01).stats
    assert half.mismatched == 0 and half.tolerance_used == pytest.approx(0.5)
    exact = compare_leaf("out", ref, ref.copy(), atol=0.1, rtol=0.01).stats
    assert exact.tolerance_used == 0.0
    failing = compare_leaf("out", ref, ref + np.array([0.4, 0.0]), atol=0.1, rtol=0.01).stats
    assert failing.mismatched == 1 and failing.tolerance_used == pytest.approx(2.0)


def test_tolerance_used_counts_only_finite_elements():
    ref = np.array([np.nan, 1.0, 2.0], np.float32)
    out = np.array([np.nan, np.inf, 2.0], np.float32)
    stats = compare_leaf("out", ref, out, atol=1e-5, rtol=1e-5).stats
    # The Inf fails the case (mismatched, inf_count); the figure measures the finite rest.
    assert stats.mismatched == 1 and stats.tolerance_used == 0.0


def test_tolerance_used_with_a_zero_tolerance():
    # Integer outputs get atol = rtol = 0: exact is 0 (0/0 counts 0), any difference has no
    # finite ratio and reads None (and fails).
    ref = np.array([0, 3, -2], np.int32)
    assert compare_leaf("out", ref, ref.copy(), 0.0, 0.0).stats.tolerance_used == 0.0
    off = compare_leaf("out", ref, ref + np.array([0, 1, 0], np.int32), 0.0, 0.0).stats
    assert off.mismatched == 1 and off.tolerance_used is None
    # atol = 0 allows nothing where the reference is 0, and something elsewhere.
    stats = compare_leaf("out", np.array([0.0, 4.0]), np.array([0.0, 4.2]), 0.0, 0.1).stats
    assert stats.tolerance_used == pytest.approx(0.5)


def test_a_case_uses_as_much_tolerance_as_its_most_demanding_leaf():
    ref = np.array([10.0, 100.0])
    leaves = [
        compare_leaf("out[0]", ref, ref + 0.05, atol=0.1, rtol=0.01).stats,  # 0.25
        compare_leaf("out[1]", ref, ref + 0.15, atol=0.1, rtol=0.01).stats,  # 0.75
    ]
    assert case_tolerance_used(leaves) == pytest.approx(0.75)
    leaves.append(compare_leaf("out[2]", np.zeros(2), np.ones(2), 0.0, 0.0).stats)
    assert case_tolerance_used(leaves) is None
    assert case_tolerance_used([]) is None


def test_tail_nan_is_boundary_with_tile_evidence():
    out = REF.copy()
    out[40:] = np.nan
    klass, stats, loc = classify(out)
    assert klass == "boundary"
    assert stats.nan_count == 5 * 320
    assert loc.tail_axes == [0]
    assert loc.tiles.only_partial_tiles and loc.tiles.bad_tiles == [[5, 0]]
    assert loc.axes[0].bad_ranges == "40-44"


def test_tail_detection_without_kernel_geometry_uses_common_blocks():
    out = REF.copy()
    out[:, 256:] += 1.0
    klass, _, loc = classify(out, geometry=[])
    assert klass == "boundary" and loc.tail_axes == [1] and loc.tiles is None


def test_nan_everywhere_is_nan_inf():
    klass, stats, loc = classify(np.full_like(REF, np.nan))
    assert klass == "nan_inf" and stats.nan_count == REF.size
    said = describe_numeric(klass, stats, loc)
    assert f"Every element is non-finite ({REF.size} NaN and 0 Inf" in said  # a start value
    assert "never written" in said  # or memory nothing wrote: fresh memory reads as NaN
    overflowed = np.full_like(REF, np.nan)
    overflowed[::2] = np.inf  # an Inf comes from arithmetic, not from unwritten memory
    klass, stats, loc = classify(overflowed)
    said = describe_numeric(klass, stats, loc)
    assert "Every element is non-finite" in said and "never written" not in said
    out = REF.copy()
    out[3, 7] = np.nan  # one bad element is local: no claim about every element
    klass, stats, loc = classify(out)
    assert klass == "nan_inf" and "Every element" not in describe_numeric(klass, stats, loc)


def test_rounding_noise_is_precision():
    out = REF.astype(ml_dtypes.bfloat16).astype(np.float32)
    klass, stats, loc = classify(out)
    assert klass == "precision", stats
    assert loc.spread and stats.rms_rel_error < 0.01


def _spread_noise(rms_rel: float) -> np.ndarray:
    noise = np.random.default_rng(1).standard_normal(REF.shape).astype(np.float32)
    return (REF + noise * rms_rel * np.sqrt(np.mean(REF**2))).astype(np.float32)


def test_precision_is_judged_against_the_kernel_s_narrowest_type():
    comparison = compare_leaf("out", REF, _spread_noise(0.02), 1e-5, 1e-5)
    loc = localise("out", comparison.bad, GEOMETRY)
    # 2 % rms error: bfloat16 rounding (eps 2^-7) can leave it, float16's (eps 2^-10) cannot.
    assert classify_numeric(comparison.stats, loc, ["bfloat16"]) == "precision"
    assert classify_numeric(comparison.stats, loc, ["float16"]) == "wrong_values"
    f16 = REF.astype(np.float16).astype(np.float32)
    comparison = compare_leaf("out", REF, f16, 1e-6, 1e-6)
    loc = localise("out", comparison.bad, GEOMETRY)
    assert classify_numeric(comparison.stats, loc, ["float16"]) == "precision"


def test_errors_at_the_output_type_s_own_rounding_point_at_the_tolerance():
    ulp_off = np.nextafter(REF, np.float32(np.inf))  # one ulp up everywhere
    comparison = compare_leaf("out", REF, ulp_off, 0.0, 1e-9)
    loc = localise("out", comparison.bad, GEOMETRY)
    klass = classify_numeric(comparison.stats, loc, [])
    text = describe_numeric(klass, comparison.stats, loc, [])
    assert text.startswith("Errors are within 4 ulps of float32") and "spec check" in text
    # A real error is not excused as rounding.
    comparison = compare_leaf("out", REF, _spread_noise(1e-4), 1e-6, 1e-6)
    loc = localise("out", comparison.bad, GEOMETRY)
    assert "ulps" not in describe_numeric("wrong_values", comparison.stats, loc, [])


def test_a_factor_that_differs_by_row_is_named_as_such():
    factors = np.linspace(0.82, 0.89, REF.shape[0], dtype=np.float32)[:, None]
    comparison = compare_leaf("out", REF, REF * factors, 1e-5, 1e-5)
    stats = comparison.stats
    assert stats.scale_fit is None
    assert stats.row_scale_range == pytest.approx([0.82, 0.89], rel=1e-4)
    loc = localise("out", comparison.bad, GEOMETRY)
    klass = classify_numeric(stats, loc, [])
    assert klass == "wrong_values"
    assert "a factor that differs by row (0.82 to 0.89" in describe_numeric(klass, stats, loc, [])


def test_constant_factor_is_wrong_values_with_the_factor():
    # Small enough to look like rounding by magnitude alone: the scale fit tells them apart.
    klass, stats, _ = classify(REF * np.float32(320 / 319))
    assert klass == "wrong_values"
    assert stats.scale_fit == pytest.approx(320 / 319, rel=1e-6)


def test_structured_error_is_wrong_values_on_the_suspected_axis():
    out = REF.copy()
    out[:, 7] += 3.0  # one column wrong: structured, large
    klass, _, loc = classify(out)
    assert klass == "wrong_values"
    assert loc.suspected_axis == 1 and loc.axes[1].bad_ranges == "7"
    assert not loc.spread


def test_structure_difference_names_shape_and_dtype():
    ref = [np.zeros((4, 8), np.float32)]
    assert structure_difference(
        ref, "PyTreeDef(*)", [np.zeros((8, 4), np.float32)], "PyTreeDef(*)"
    ) == ("out is float32[8, 4], the reference's is float32[4, 8]")
    assert "float16" in structure_difference(
        ref, "PyTreeDef(*)", [np.zeros((4, 8), np.float16)], "PyTreeDef(*)"
    )
    assert "structure" in structure_difference(ref, "PyTreeDef(*)", ref * 2, "PyTreeDef((*, *))")
    assert structure_difference(ref, "PyTreeDef(*)", ref, "PyTreeDef(*)") is None


def _case(profile, passed, klass=None):
    return CaseResult(
        suite="extended",
        name=profile,
        dims={},
        dtype="float32",
        profile=profile,
        passed=passed,
        failure_class=klass,
    )


def test_failure_only_on_adversarial_profile_is_unstable():
    cases = [_case("normal", True), _case("large", False, "nan_inf")]
    refine_unstable(cases)
    assert cases[1].failure_class == "unstable"
    # When normal inputs fail numerically too, the adversarial failure keeps its class.
    cases = [_case("normal", False, "wrong_values"), _case("large", False, "nan_inf")]
    refine_unstable(cases)
    assert cases[1].failure_class == "nan_inf"


def test_primary_class_is_the_most_fundamental():
    assert ranked_classes(["precision", "compile_error", "boundary"])[0] == "compile_error"
    assert ranked_classes(["unstable", "wrong_values"]) == ["wrong_values", "unstable"]


def test_a_primary_class_from_a_target_leaves_the_cases_described_by_their_own():
    # A target's grid_race outranks a bf16 case's precision failure: the run's description
    # still names the cases' own class (the target's finding is said before it).
    cases = [_case("normal", True), _case("bf16", False, "precision")]
    text = describe_run(cases, "grid_race")
    assert text.startswith("precision: 1/2 cases fail") and "First precision case" in text


def test_index_ranges_are_compact():
    assert index_ranges(np.array([3, 40, 41, 42, 63])) == "3, 40-42, 63"
    assert "more ranges" in index_ranges(np.arange(0, 40, 2))


def test_error_summary_points_at_the_candidates_line():
    raw = {
        "phase": "trace",
        "type": "ValueError",
        "message": "Invalid dtype for `swap`.\nFor simplicity, JAX has removed its internal frames",
        "frames": [
            {"file": "/x/jax/_src/core.py", "line": 10, "name": "bind", "code": "..."},
            {"file": "/tmp/h/kern.py", "line": 15, "name": "_body", "code": "o_ref[...] = y"},
        ],
    }
    info = summarise_error(raw, "kern.py")
    assert info.location == "kern.py:15" and info.source_line == "o_ref[...] = y"
    assert info.message == "Invalid dtype for `swap`."
    assert info.excerpt[-1] == "ValueError: Invalid dtype for `swap`."


def test_arrays_round_trip_bfloat16_without_pickle(tmp_path):
    arrays = [REF.astype(ml_dtypes.bfloat16), np.arange(5, dtype=np.int32), np.array(True)]
    save_arrays(tmp_path / "a.npz", arrays, {"treedef": "PyTreeDef((*, *, *))"})
    loaded, extra = load_arrays(tmp_path / "a.npz")
    assert [a.dtype for a in loaded] == [a.dtype for a in arrays]
    assert all(np.array_equal(a, b) for a, b in zip(arrays, loaded, strict=True))
    assert extra == {"treedef": "PyTreeDef((*, *, *))"}


def test_geometry_from_the_child_is_used_only_when_well_formed():
    from nearmiss.engine.runner.session import _checked_geometry

    assert _checked_geometry(GEOMETRY) == GEOMETRY
    for forged in (
        None,
        "grid",
        [{"grid": [1]}],
        [{"grid": ["x"], "outputs": []}],
        [{"grid": [1], "outputs": [{"array_shape": [2], "block_shape": None}]}],
    ):
        assert _checked_geometry(forged) == []


def _rows_bad(fail_rows, shape=(6, 4)):
    bad = np.zeros(shape, bool)
    bad[list(fail_rows)] = True
    return bad


def test_the_integer_input_that_sets_failing_rows_apart_is_named():
    from nearmiss.engine.forensics.triggers import value_trigger

    lengths = np.array([512, 256, 279, 395, 100, 512], np.int32)
    # Rows with a length off the 128-block fail; the whole-block ones pass.
    text = value_trigger(_rows_bad([2, 3, 4]), [("lengths", lengths)], {"S": 512}, [128])
    assert "exactly those where lengths is not a multiple of 128" in text
    assert "279, 395" in text and "output axis 0: 2-4 fail" in text
    # Rows shorter than the sequence fail: a threshold, named after the dim it equals.
    lengths = np.array([512, 300, 200, 512, 100, 512], np.int32)
    text = value_trigger(_rows_bad([1, 2, 4]), [("lengths", lengths)], {"S": 512})
    assert "lengths < 512 (= S)" in text


def test_no_trigger_without_contrast_or_a_matching_input():
    from nearmiss.engine.forensics.triggers import value_trigger

    lengths = np.array([5, 5, 7, 7, 9, 9], np.int32)
    assert value_trigger(_rows_bad(range(6)), [("lengths", lengths)], {}) is None  # all fail
    assert value_trigger(_rows_bad([0]), [("lengths", lengths[:5])], {}) is None  # no such axis
    # One value both fails and passes: it is not what triggers the failure.
    assert value_trigger(_rows_bad([0, 2]), [("lengths", lengths)], {}) is None
    # Sets apart, but by no simple rule: the values themselves are the evidence.
    text = value_trigger(_rows_bad([0, 1, 4, 5]), [("lengths", lengths)], {}, [])
    assert text.startswith("The failing rows differ from the passing ones in lengths")
    assert "5, 9 where it fails, 7 where it passes" in text


def _attention(q, k, v, lengths, shift=0):
    """Per-row length-masked attention; ``shift`` moves the mask's edge (the planted bug)."""
    s = np.einsum("bqd,bkd->bqk", q, k)
    keep = np.arange(k.shape[1])[None, None, :] < (lengths + shift)[:, None, None]
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bqk,bkd->bqd", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize(
    ("shift", "said"),
    [
        (-1, "at lengths - 1, each row's last valid position"),
        (1, "at lengths, the first position past each row's valid ones"),
    ],
)
def test_the_error_is_followed_to_the_reduced_position_it_comes_from(shift, said):
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((4, 8, 32)) * 0.3 for _ in range(3))
    v = rng.standard_normal((4, 64, 32))
    k = rng.standard_normal((4, 64, 32)) * 0.3
    lengths = np.array([64, 17, 40, 9], np.int32) - (shift > 0)  # room for one more key
    ref = _attention(q, k, v, lengths)
    out = _attention(q, k, v, lengths, shift)
    inputs = [("q", q), ("k", k), ("v", v), ("lengths", lengths)]
    text = attribute_error(out, ref, np.abs(out - ref) > 1e-6, inputs)
    assert text.startswith("The error follows v along its axis 1 (size 64")
    assert said in text


def test_keys_dropped_at_each_block_edge_are_named_together():
    """A split-K decode whose window mask starts one past each split's first key drops keys
    0, 64 and 128 at once: no single slice follows the error, the set does (with the softmax's
    renormalisation, which the fit allows for)."""
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 8, 48)) * 0.3  # (batch, heads, features)
    k = rng.standard_normal((2, 192, 48)) * 0.3  # (batch, keys, features), three blocks of 64
    v = rng.standard_normal((2, 192, 48))
    lengths = np.full(2, 192, np.int32)
    ref = _attention(q, k, v, lengths)
    keep = np.ones(192, bool)
    keep[[0, 64, 128]] = False
    out = _attention(q, k[:, keep], v[:, keep], lengths - 3)
    inputs = [("q", q), ("k", k), ("v", v)]
    text = attribute_error(out, ref, np.abs(out - ref) > 1e-6, inputs)
    assert "follows v along its axis 1 (size 192" in text
    assert "positions 0, 64 and 128 (each the first of a block of 64), together" in text
    # Errors that follow no input at all stay unattributed, however many positions are tried.
    noise = rng.standard_normal(ref.shape) * 0.1
    assert attribute_error(ref + noise, ref, np.ones_like(ref, bool), inputs) is None


def test_a_softmax_made_too_sharp_is_named_as_one_element_per_row():
    """Logits divided by the scale instead of multiplied: each row's output is nearly one value
    row, a different one per row, where the reference averages many."""
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 16, 64)) * 0.125
    k, v = rng.standard_normal((2, 128, 64)), rng.standard_normal((2, 128, 64))
    full = np.full(2, 128, np.int32)
    ref = _attention(q, k, v, full)
    out = _attention(q * 64.0, k, v, full)
    text = attribute_error(out, ref, np.abs(out - ref) > 1e-6, [("q", q), ("k", k), ("v", v)])
    assert text.startswith(
        "Each failing row's error follows a single element of v along its axis 1"
    )
    assert "a different one per row" in text and "weights too sharp" in text
    # Over eight features the best of 128 slices fits noise as well: no such lead there.
    few = rng.standard_normal((2, 128, 8))
    ref8 = _attention(q[..., :8], k[..., :8], few, full)
    out8 = _attention(q[..., :8] * 64.0, k[..., :8], few, full)
    mask8 = np.abs(out8 - ref8) > 1e-6
    text8 = attribute_error(out8, ref8, mask8, [("q", q[..., :8]), ("k", k[..., :8]), ("v", few)])
    assert text8 is None or "single element" not in text8


def test_a_dropped_diagonal_is_named_and_unrelated_errors_are_not_attributed():
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 16, 32))  # (rows, reduced, features)
    ref = x.sum(axis=1)  # (16, 32)
    out = ref - x[np.arange(16), np.arange(16)]  # row i drops element i: a diagonal
    everywhere = np.ones_like(ref, bool)
    text = attribute_error(out, ref, everywhere, [("x", x)])
    assert "at the output's own index along axis 0 (a diagonal)" in text
    noise = rng.standard_normal(ref.shape)  # wrong everywhere, following no input element
    assert attribute_error(ref + noise, ref, everywhere, [("x", x)]) is None
    # An elementwise path scaled wrong follows its own input element: no reduction to blame.
    y = rng.standard_normal((16, 32))
    scaled = 2.0 * y
    assert attribute_error(scaled * 1.1, scaled, np.ones_like(y, bool), [("y", y)]) is None


def test_a_vector_output_is_one_row():
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 32))  # a column sum: (rows, cols) -> (cols,)
    ref = x.sum(axis=0)
    out = ref - x[63]  # the last row left out of every column's sum
    text = attribute_error(out, ref, np.ones_like(ref, bool), [("x", x)])
    assert "along its axis 0 (size 64" in text and "position 63 (its last)" in text
    assert attribute_error(ref[:1] + 1, ref[:1], np.ones(1, bool), [("x", x)]) is None


def test_failing_rows_that_are_an_input_s_zero_rows_are_named():
    from nearmiss.engine.forensics.triggers import value_trigger

    x = np.random.default_rng(6).standard_normal((2, 8, 16))
    x[:, [0, 4]] = 0.0  # two all-zero rows per batch
    bad = np.zeros_like(x, bool)
    bad[:, [0, 4]] = True
    text = value_trigger(bad, [("x", x)], {})
    assert text.startswith("The failing rows are exactly those where x is all zeros")
    bad[0, 1, 3] = True  # a failing row that is not zero: no such claim
    assert value_trigger(bad, [("x", x)], {}) is None


def test_the_pursuit_survives_zero_slices_and_names_no_noise_over_few_rows():
    """A zero-padded cache past each row's length correlates with nothing: the pursuit must
    not pick a position twice (it used to crash the check); and one row is too few to call
    its picks common."""
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(9)
    k = rng.standard_normal((4, 16, 32))
    for row, length in enumerate([2, 10, 12, 16]):
        k[row, length:] = 0.0
    ref = k.sum(axis=1)
    out = ref - k[:, 0] - k[:, 8]
    attribute_error(out, ref, np.ones_like(ref, bool), [("k", k)])  # no exception
    x = rng.standard_normal((1, 64, 48))
    ref1 = x.sum(axis=1)
    out1 = ref1 - x[:, 0] - x[:, 16]
    text = attribute_error(out1, ref1, np.ones_like(ref1, bool), [("x", x)])
    assert text is None or "together" not in text


def test_a_common_position_with_a_few_strays_is_not_called_scattered():
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(10)
    k = rng.standard_normal((20, 64, 48))
    ref = k.sum(axis=1)
    dropped = np.where(np.arange(20) < 17, 5, 9)
    out = ref - k[np.arange(20), dropped]
    text = attribute_error(out, ref, np.ones_like(ref, bool), [("k", k)])
    assert text is None or "a different one per row" not in text


def _multiplied_mask(q, k, v, lengths, window_from=False):
    """The length mask multiplied into the logits: every padding key gets logit 0, one weight.
    ``window_from``: the mask keeps the keys from ``lengths`` on instead (a sliding window)."""
    s = np.einsum("bqd,bkd->bqk", q, k)
    position = np.arange(k.shape[1])[None, None, :]
    keep = position >= lengths[:, None, None] if window_from else position < lengths[:, None, None]
    s = s * keep
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bqk,bkd->bqd", p / p.sum(-1, keepdims=True), v)


def test_padding_let_in_past_a_boundary_is_named_as_a_run():
    """No single key and no few keys explain it: the sum of every key past the mask's edge
    does — the same edge for every row, or each row's length."""
    from nearmiss.engine.forensics.attribution import attribute_error

    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 16, 64)) * 0.125
    k, v = rng.standard_normal((2, 256, 64)), rng.standard_normal((2, 256, 64))
    inputs = [("q", q), ("k", k), ("v", v)]
    edge = np.full(2, 150, np.int32)
    ref, out = _attention(q, k, v, edge), _multiplied_mask(q, k, v, edge)
    text = attribute_error(out, ref, np.abs(out - ref) > 1e-6, inputs)
    assert text.startswith("The error follows the sum of v along its axis 1 (size 256")
    assert "over the positions from 150 to its end" in text
    # Per-row lengths: the run starts at each row's own length.
    q8 = rng.standard_normal((8, 4, 64)) * 0.125
    k8, v8 = rng.standard_normal((8, 256, 64)), rng.standard_normal((8, 256, 64))
    lengths = np.array([40, 90, 100, 130, 170, 200, 220, 250], np.int32)
    ref8, out8 = _attention(q8, k8, v8, lengths), _multiplied_mask(q8, k8, v8, lengths)
    both = [("q", q8), ("k", k8), ("v", v8), ("lengths", lengths)]
    text8 = attribute_error(out8, ref8, np.abs(out8 - ref8) > 1e-6, both)
    assert "over the positions from lengths to its end" in text8
    # Without the lengths to follow, a boundary that differs per row by no rule is no lead.
    text_no_rule = attribute_error(out8, ref8, np.abs(out8 - ref8) > 1e-6, both[:3])
    assert text_no_rule is None or "the sum of" not in text_no_rule
    # A sum whose loop starts at 64 instead of 0 leaves a head out: with the reference's own
    # row allowed for, that is the tail kept as well, and either way the edge is 64.
    x = rng.standard_normal((16, 128, 32))
    ref_sum, late = x.sum(axis=1), x[:, 64:].sum(axis=1)
    text_late = attribute_error(late, ref_sum, np.ones_like(late, bool), [("x", x)])
    assert "the sum of x along its axis 1 (size 128" in text_late
    assert "(a mask or a bound at 64)" in text_late
    # A window that should start at key 100 lets the keys before it in: a head.
    start = np.full(2, 100, np.int32)
    window = _multiplied_mask(q, k, v, start, window_from=True)
    keep = np.arange(256) >= 100
    ref_window = _attention(q, k[:, keep], v[:, keep], np.full(2, 156, np.int32))
    text_head = attribute_error(window, ref_window, np.abs(window - ref_window) > 1e-6, inputs)
    assert "over the positions from its start up to 100" in text_head
    # A split-K loop that skips the last split lets in only the padding of the split the edge
    # falls in: a run with two ends (JAX's decode, 300 valid keys in splits of 128).
    inside = _multiplied_mask(q, k[:, :200], v[:, :200], edge)  # keys past 200 never visited
    text_inner = attribute_error(inside, ref, np.abs(inside - ref) > 1e-6, inputs)
    assert "over the positions 150-199: correlation 1.00" in text_inner
