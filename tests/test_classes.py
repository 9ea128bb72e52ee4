"""Every failure class of DESIGN.md, each produced by a planted kernel, with actionable evidence."""

from __future__ import annotations

import pytest

from conftest import MATMUL_SPEC, OPS, PLANTED, SOFTMAX_SPEC
from nearmiss.engine.check import check

SOFTMAX_VARIANTS = OPS / "softmax_rows" / "variants"
MATMUL_VARIANTS = OPS / "matmul" / "variants"


def test_a_golden_kernel_is_certified_with_no_failure_class():
    # One golden stands for all: what a certified report says does not depend on the kernel,
    # and every corpus golden's certification is the sweep's (test_corpus_sweep.py).
    spec = SOFTMAX_SPEC
    report = check(spec, spec.parent / "golden.py", "all", seed=11)
    assert report.certified, report.diagnosis
    assert report.failure_class is None and report.failure_classes == []
    assert report.compact_passed and report.extended_passed


# Each class on the smallest suite that shows it: the compact suite's one case, else the
# extended suite (a ragged size, a value profile). A case is classified alike in any suite, and
# the hidden cases of ``all`` only repeat the class here (the crash of ``runtime_raise`` six
# times over, half a minute of filling memory).
CLASSES = [
    ("compile_error", MATMUL_SPEC, MATMUL_VARIANTS / "index_map_arity.py", "compact"),
    ("runtime_error", SOFTMAX_SPEC, PLANTED / "runtime_raise.py", "compact"),
    ("shape_mismatch", SOFTMAX_SPEC, PLANTED / "transposed_output.py", "compact"),
    ("nan_inf", MATMUL_SPEC, MATMUL_VARIANTS / "missing_init.py", "compact"),
    ("boundary", SOFTMAX_SPEC, SOFTMAX_VARIANTS / "floor_grid.py", "extended"),
    ("unstable", SOFTMAX_SPEC, SOFTMAX_VARIANTS / "no_max_subtraction.py", "extended"),
    ("precision", MATMUL_SPEC, MATMUL_VARIANTS / "bf16_accumulator.py", "compact"),
    ("wrong_values", MATMUL_SPEC, MATMUL_VARIANTS / "no_accumulate.py", "compact"),
]


@pytest.mark.parametrize(
    ("expected", "spec", "candidate", "suite"), CLASSES, ids=[c[0] for c in CLASSES]
)
def test_each_failure_class_is_reported(expected, spec, candidate, suite):
    report = check(spec, candidate, suite, seed=5)
    assert not report.certified
    assert report.failure_class == expected, report.diagnosis
    assert expected in report.failure_classes
    assert f"{expected}: " in report.diagnosis
    failing = [c for c in report.cases if not c.passed]
    assert failing and all(c.diagnosis for c in failing)


def test_compile_error_points_at_the_candidates_line():
    report = check(MATMUL_SPEC, MATMUL_VARIANTS / "wrong_out_dtype.py", "extended", seed=5)
    case = next(c for c in report.cases if not c.passed)
    assert case.name == "bf16" and case.failure_class == "compile_error"
    assert case.error.location.startswith("wrong_out_dtype.py:")
    assert "o_ref[...] +=" in case.error.source_line
    assert len(case.error.excerpt) <= 6


def test_a_ragged_tail_bug_passes_compact_and_fails_extended_with_localisation():
    report = check(SOFTMAX_SPEC, SOFTMAX_VARIANTS / "floor_grid.py", "all", seed=5)
    assert report.compact_passed is True and report.extended_passed is False
    assert "only the extended suite fails" in report.diagnosis
    ragged = next(c for c in report.cases if c.name == "ragged")
    loc = ragged.localisation
    assert loc.tail_axes == [0] and loc.axes[0].bad_ranges == "40-44"
    assert loc.tiles.block_shape == [8, 320] and loc.tiles.only_partial_tiles
    assert ragged.kernel_grid == [5]  # floor(45 / 8): the evidence shows the short grid
    # The unwritten tail is NaN: the sentence counts them, the error figures are the finite ones'.
    assert "1600 NaN and 0 Inf where the reference is finite" in ragged.diagnosis
    # The compact suite alone certifies it: full coverage is what catches the bug.
    assert check(SOFTMAX_SPEC, SOFTMAX_VARIANTS / "floor_grid.py", "compact", seed=5).certified


def test_unstable_names_the_value_profile_and_precision_is_not_wrong_values():
    # The value profile is the extended suite's; the precision evidence is the first case's.
    unstable = check(SOFTMAX_SPEC, SOFTMAX_VARIANTS / "no_max_subtraction.py", "extended", seed=5)
    large = next(c for c in unstable.cases if not c.passed)
    assert large.profile == "large" and "'large' value profile" in large.diagnosis
    precision = check(MATMUL_SPEC, MATMUL_VARIANTS / "bf16_accumulator.py", "compact", seed=5)
    stats = precision.cases[0].leaves[0]
    assert stats.rms_rel_error < 0.01 and stats.nan_count == 0
    assert precision.cases[0].localisation.spread


def test_small_spread_errors_from_a_float32_only_kernel_are_not_precision():
    # A mask off by one looks like rounding noise; with no narrower type in the kernel it is
    # not precision, and the diagnosis says where to look instead: each row is off by its own
    # factor (its normaliser misses an element).
    report = check(SOFTMAX_SPEC, PLANTED / "softmax_sum_skips_last.py", "compact", seed=5)
    assert report.failure_class == "wrong_values", report.diagnosis
    assert "a factor that differs by row" in report.diagnosis
    assert "off by one" in report.diagnosis


def test_seed_reproduces_a_run_and_the_default_seed_varies():
    first = check(SOFTMAX_SPEC, SOFTMAX_VARIANTS / "no_max_subtraction.py", "extended", seed=42)
    again = check(SOFTMAX_SPEC, SOFTMAX_VARIANTS / "no_max_subtraction.py", "extended", seed=42)
    assert first.seed == again.seed == 42
    assert [c.leaves[0].model_dump() for c in first.cases] == [
        c.leaves[0].model_dump() for c in again.cases
    ]
    other = check(SOFTMAX_SPEC, SOFTMAX_VARIANTS / "no_max_subtraction.py", "extended", seed=43)
    assert [c.leaves[0].max_abs_error for c in other.cases] != [
        c.leaves[0].max_abs_error for c in first.cases
    ]


def test_an_exception_raised_without_a_message_still_says_what_it_knows(tmp_path):
    # JAX's custom_vjp raises a bare AttributeError() (name and obj set, no text): the
    # classic slip of treating megablox's `gmm` function as its module.
    candidate = tmp_path / "gmm_slip.py"
    candidate.write_text(
        "from jax.experimental.pallas.ops.tpu import megablox\n\n\n"
        "def kernel(x):\n    return megablox.gmm.gmm(x)\n"
    )
    report = check(SOFTMAX_SPEC, candidate, "compact", seed=5)
    assert report.failure_class == "compile_error"
    assert "AttributeError: 'custom_vjp' object has no attribute 'gmm'" in report.diagnosis
    assert "gmm_slip.py:5" in report.diagnosis
