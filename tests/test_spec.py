"""The spec contract: OpSpec and Case as in DESIGN.md, validated on construction and load."""

from __future__ import annotations

import pytest

from nearmiss.engine.spec import (
    DEFAULT_TOLERANCES,
    NORMAL_PROFILE,
    Case,
    OpSpec,
    SpecError,
    load_spec,
)


def _spec(**overrides):
    fields = dict(
        name="op",
        category="reduction",
        reference=lambda x: x,
        make_inputs=lambda case, key: (),
        compact=[Case("base", {"N": 8})],
    )
    fields.update(overrides)
    return OpSpec(**fields)


def test_case_defaults_match_the_design():
    case = Case("base", {"R": 64, "C": 256})
    assert (case.dtype, case.profile) == ("float32", NORMAL_PROFILE)
    assert not case.adversarial
    assert Case("large", {"R": 1}, profile="large").adversarial


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "float8"}, "unknown dtype 'float8'"),
        ({"dims": {"R": 0}}, "must be positive"),
        ({"dims": {"R": 2.5}}, "must be str -> int"),
        ({"dims": [("R", 3)]}, "dims must be a dict"),
        ({"name": ""}, "identifier-like"),
        ({"profile": "two words"}, "must be a word"),
    ],
)
def test_bad_cases_are_refused_with_a_clear_message(kwargs, message):
    fields = {"name": "c", "dims": {"R": 4}, **kwargs}
    with pytest.raises(SpecError, match=message):
        Case(**fields)


def test_spec_validation_names_the_problem():
    with pytest.raises(SpecError, match="unknown category 'sorting'"):
        _spec(category="sorting")
    with pytest.raises(SpecError, match="compact suite is empty"):
        _spec(compact=[])
    with pytest.raises(SpecError, match="duplicate case name 'base'"):
        _spec(extended=[Case("base", {"N": 16})])
    with pytest.raises(SpecError, match="reference must be callable"):
        _spec(reference=None)
    with pytest.raises(SpecError, match="tolerance for unknown dtype"):
        _spec(tolerance={"float128": (1e-5, 1e-5)})
    with pytest.raises(SpecError, match=r"must be \(atol, rtol\)"):
        _spec(tolerance={"float32": (1e-5,)})
    with pytest.raises(SpecError, match="must hold Case objects"):
        _spec(extended=[{"name": "x"}])


def test_default_tolerances_apply_per_dtype_and_spec_overrides_win():
    spec = _spec(tolerance={"float32": (1e-3, 0)})
    assert spec.tolerance_for("float32") == (1e-3, 0.0)
    assert spec.tolerance_for("bfloat16") == DEFAULT_TOLERANCES["bfloat16"]
    assert spec.tolerance_for("int32") == (0.0, 0.0)
    # Every dtype a Case accepts has a default.
    for dtype in DEFAULT_TOLERANCES:
        assert len(spec.tolerance_for(dtype)) == 2


def test_suites_select_cases():
    spec = _spec(extended=[Case("ragged", {"N": 9})])
    assert [c.name for c in spec.suite("compact")] == ["base"]
    assert [c.name for c in spec.suite("extended")] == ["ragged"]
    assert [c.name for c in spec.suite("all")] == ["base", "ragged"]
    with pytest.raises(SpecError, match="unknown suite"):
        spec.suite("everything")


def test_load_spec_reports_unusable_files(tmp_path):
    missing = tmp_path / "missing.py"
    with pytest.raises(SpecError, match="not found"):
        load_spec(missing)
    broken = tmp_path / "broken.py"
    broken.write_text("SPEC = (\n")
    with pytest.raises(SpecError, match="syntax error in spec"):
        load_spec(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(SpecError, match="defines no SPEC"):
        load_spec(empty)
    wrong = tmp_path / "wrong.py"
    wrong.write_text("SPEC = {'name': 'op'}\n")
    with pytest.raises(SpecError, match="not an OpSpec"):
        load_spec(wrong)
    failing = tmp_path / "failing.py"
    failing.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(SpecError, match="failed to import: ModuleNotFoundError"):
        load_spec(failing)


def test_bundled_specs_load():
    from pallas_ops.catalog import operators

    for op in operators():
        spec = load_spec(op.spec)
        assert spec.compact and spec.extended, op.name


def test_every_labelled_variant_exists_with_a_known_failure_class():
    from nearmiss.engine.models import FAILURE_PRIORITY
    from pallas_ops.catalog import operators

    ops = operators()
    assert {op.name for op in ops} >= {"softmax_rows", "matmul"}
    for op in ops:
        assert op.variants, op.name
        for variant in op.variants:
            assert variant.path.is_file(), variant.path
            assert variant.failure_class in FAILURE_PRIORITY
            assert variant.bug_family and variant.diagnosis
