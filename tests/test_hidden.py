"""Hidden cases: what the engine draws beyond the listed cases, and what they catch.

The drawing is pure (a spec's declarations and a seed in, cases out) and tested as such; the
effect tests run kernels that are right on every listed case and wrong on inputs the spec
allows (``tests/forgeries/hidden_*.py``, each docstring says how): none is certified.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import MATMUL_SPEC, SOFTMAX_SPEC
from nearmiss.engine import hidden
from nearmiss.engine.check import check, redrawn_results
from nearmiss.engine.integrity.dynamic import Probe
from nearmiss.engine.models import CaseResult
from nearmiss.engine.runner.session import CaseInfo, RawCase, RawRun
from nearmiss.engine.spec import Case, Dim, OpSpec, SpecError, load_spec

FORGERIES = Path(__file__).resolve().parent / "forgeries"


def _spec(*cases: Case, **extra) -> OpSpec:
    return OpSpec(
        name="op",
        category="elementwise",
        reference=lambda x: x,
        make_inputs=lambda case, key: (jnp.zeros((1,)),),
        compact=[cases[0]],
        extended=list(cases[1:]),
        **extra,
    )


def test_a_dims_domain_is_what_its_listed_values_imply_unless_the_spec_says():
    spec = _spec(Case("a", {"R": 64, "C": 256, "D": 128}), Case("b", {"R": 45, "C": 320, "D": 128}))
    found = {dim: hidden.describe(d) for dim, d in hidden.domains(spec).items()}
    assert found == {"R": "45..128", "C": "256..640 step 64", "D": "128"}
    declared = _spec(Case("a", {"R": 64}), domains={"R": Dim(min=8, max=512, multiple_of=8)})
    assert hidden.describe(hidden.domains(declared)["R"]) == "8..512 step 8"


def test_the_same_seed_draws_the_same_cases_and_they_stay_in_domain_and_budget():
    spec = load_spec(MATMUL_SPEC)
    domains = hidden.domains(spec)
    largest = max(math.prod(c.dims.values()) for c in (*spec.compact, *spec.extended))
    seen = set()
    for seed in range(20):
        drawn = hidden.draw(spec, seed)
        assert drawn == hidden.draw(spec, seed)
        for sizes in drawn[:2]:
            assert math.prod(sizes.case.dims.values()) <= hidden.GROWTH * largest
            for dim, value in sizes.case.dims.items():
                assert value in domains[dim].values(10**9)
            seen.add(tuple(sizes.case.dims.values()))
        assert drawn[-1].case.name.startswith("values-x") and drawn[-1].scales[0] > 1
    listed = {tuple(c.dims.values()) for c in (*spec.compact, *spec.extended)}
    assert len(seen - listed) > 5  # sizes no case lists, varying from check to check


def test_a_spec_with_one_size_per_dim_gets_a_note_and_no_value_scale_when_it_says_so():
    spec = _spec(Case("a", {"R": 64, "C": 256}), value_scales=())
    notes = hidden.narrow(spec)
    assert any("no size to draw" in n and "R, C" in n for n in notes)
    assert any("value_scales=()" in n for n in notes)
    assert [h.case.name for h in hidden.draw(spec, 3)] == ["larger"]  # no size to move


def test_only_signal_like_float_inputs_are_scaled():
    normal = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    assert hidden.scalable(np, normal)
    assert hidden.scalable(np, jnp.asarray(normal, jnp.bfloat16))
    assert not hidden.scalable(np, (normal > 0).astype(np.float32))  # a mask
    assert not hidden.scalable(np, np.abs(normal))  # probabilities, scales, variances
    assert not hidden.scalable(np, np.arange(16, dtype=np.int32) - 8)  # indices, lengths


@pytest.mark.parametrize(
    "bad",
    [
        {"domains": {"Q": Dim(min=1)}},
        {"domains": {"R": (1, 8)}},
        {"value_scales": (0.0,)},
        {"value_scales": ("8",)},
    ],
)
def test_a_spec_with_a_bad_domain_or_scale_fails_with_one_line(bad):
    with pytest.raises(SpecError):
        _spec(Case("a", {"R": 64}), **bad)
    with pytest.raises(SpecError):
        Dim(min=16, max=8)


@pytest.mark.parametrize(
    ("spec", "candidate", "seed"),
    [
        (SOFTMAX_SPEC, "hidden_value_range.py", 1),  # values past the listed profiles
        (SOFTMAX_SPEC, "hidden_fixed_grid.py", 0),  # more rows than the listed cases
        (MATMUL_SPEC, "hidden_capped_k_steps.py", 3),  # a deeper K than the listed cases
    ],
)
def test_a_kernel_right_on_every_listed_case_only_is_not_certified(spec, candidate, seed):
    report = check(spec, FORGERIES / candidate, "all", seed)
    listed = [c for c in report.cases if c.suite != "hidden"]
    assert listed and all(c.passed for c in listed), report.diagnosis
    assert any(c.suite == "hidden" and not c.passed for c in report.cases)
    assert not report.certified
    assert f"--seed {seed}" in report.diagnosis


def test_a_golden_certifies_with_its_hidden_cases_and_a_fixers_run_has_none():
    report = check(SOFTMAX_SPEC, SOFTMAX_SPEC.parent / "golden.py", "all", 11)
    assert report.certified, report.diagnosis
    names = [c.name for c in report.cases if c.suite == "hidden"]
    assert names[:2] == ["larger", "unlisted"] and names[2].startswith("values-x")
    assert report.domains == {"R": "45..128", "C": "256..640 step 64"}
    compact = check(SOFTMAX_SPEC, SOFTMAX_SPEC.parent / "golden.py", "compact", 11)
    assert {c.suite for c in compact.cases} == {"compact"}


def test_a_kernel_wrong_on_a_redrawn_input_fails_as_a_hidden_case():
    def raw(outputs):
        info = CaseInfo("compact", "base", {"R": 2}, "float32", "normal", 1e-5, 1e-5)
        case = RawCase(info, reference=[np.ones(4, np.float32)], reference_tree="*")
        case.probes = [Probe(0, [np.full(4, 2.0, np.float32)], outputs)]
        return case

    passed = CaseResult(
        suite="compact", name="base", dims={"R": 2}, dtype="float32", profile="normal",
        passed=True, atol=1e-5, rtol=1e-5,
    )  # fmt: skip
    run = RawRun("op", "elementwise", "", "cpu", "0", [raw([np.full(4, 2.0, np.float32)])])
    assert redrawn_results(run, [passed]) == []
    run.cases = [raw([np.full(4, 1.0, np.float32)])]  # the listed draw's answer, again
    (found,) = redrawn_results(run, [passed])
    assert (found.suite, found.name, found.passed) == ("hidden", "base-redraw-0", False)
    assert "input #0" in found.diagnosis


def test_draws_reach_between_the_listed_sizes_and_profiles_as_well_as_past_them():
    """A kernel wrong on a band between the listed sizes (K=384 when 128, 256 and 512 are
    listed) or values (between the normal and the large profile) must meet one across checks."""
    matmul = load_spec(MATMUL_SPEC)
    larger = {hidden.draw(matmul, seed)[0].case.dims["K"] for seed in range(40)}
    unlisted = {hidden.draw(matmul, seed)[1].case.dims["K"] for seed in range(40)}
    # (a dim the size budget cannot move keeps its listed value)
    assert any(k > 512 for k in larger) and not larger & {384} and 384 in unlisted
    softmax = load_spec(SOFTMAX_SPEC)
    profiles = {hidden.draw(softmax, seed)[-1].case.profile for seed in range(20)}
    assert profiles == {"normal", "large"}


def test_odd_sizes_stay_odd():
    """Filter widths 5 and 7 imply odd widths (a golden whose halo assumes an odd filter was
    refused on even ones); a spec says so itself with ``Dim(step=...)``."""
    spec = _spec(Case("a", {"K": 5}), Case("b", {"K": 7}))
    assert list(hidden.domains(spec)["K"].values(100)) == [5, 7, 9, 11, 13]
    assert list(Dim(min=3, max=9, step=2).values(100)) == [3, 5, 7, 9]
    with pytest.raises(SpecError):
        Dim(multiple_of=8, step=2)
