"""`nearmiss spec check` and `nearmiss spec new`: tolerances judged against the reference's noise.

The retyping interpreter and the judgement are tested in-process on hand-made numbers; the
commands end to end, as a user runs them (the spec is only ever run in its sandbox child).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from conftest import OPS, run_cli
from nearmiss.engine.authoring.calibration import (
    CaseNoise,
    SpecNoise,
    advise,
    judge_case,
    tolerance_used,
)
from nearmiss.engine.authoring.spec_new import ragged, with_tolerance
from nearmiss.engine.runner.retype import retyped_evaluation, small_constants

SHIPPED = Path(__file__).parent / "shipped"


def _mixed(x):
    """Widens and narrows like real references, with a loop, a branch and a typed dot."""
    y = x.astype(jnp.float32)
    total = jax.lax.fori_loop(0, 3, lambda i, acc: acc + jnp.sum(y), 0.0)
    picked = jax.lax.cond(total > 0, lambda v: v * 2, lambda v: v - 1, y)
    dot = jnp.dot(y[None], y[:, None], preferred_element_type=jnp.float32)[0, 0]
    return (jax.nn.softmax(y) * total + picked + dot).astype(x.dtype)


def test_the_same_trace_evaluates_in_float64_and_in_bfloat16_through_casts_and_loops():
    x = jax.random.normal(jax.random.PRNGKey(0), (4096,), jnp.float32)
    closed = jax.make_jaxpr(_mixed)(x)
    reference = np.asarray(_mixed(x)).astype(np.float64)
    with _x64():
        truth = retyped_evaluation(closed, [np.asarray(x)], np.float64)[0]
        narrow = retyped_evaluation(closed, [np.asarray(x)], ml_dtypes.bfloat16)[0]
    # The casts inside followed the new type: float64 out, bfloat16 out.
    assert truth.dtype == np.float64 and narrow.dtype == np.dtype(ml_dtypes.bfloat16)
    scale = np.abs(reference).max()
    noise = np.abs(truth - reference).max() / scale
    bug = np.abs(narrow.astype(np.float64) - reference).max() / scale
    assert 0 < noise < 1e-6  # float32 rounding, measured
    assert bug > 1e-3  # bfloat16 rounding: three orders more


class _x64:
    def __enter__(self):
        jax.config.update("jax_enable_x64", True)

    def __exit__(self, *exc):
        jax.config.update("jax_enable_x64", False)


def test_tolerance_used_is_the_check_s_own_ratio():
    ref = np.array([1.0, -2.0, 0.0, np.inf])
    assert tolerance_used(ref, ref, 1e-3, 1e-3) == 0.0
    # err 1e-3 at |ref| = 1 against atol + rtol*1 = 2e-3: half used.
    assert tolerance_used(ref + [1e-3, 0, 0, 0], ref, 1e-3, 1e-3) == pytest.approx(0.5)
    assert tolerance_used(ref + [0, 0, 0.1, 0], ref, 1e-3, 1e-3) == pytest.approx(100)
    assert tolerance_used(np.array([np.nan, -2.0, 0.0, np.inf]), ref, 1, 1) == math.inf


@pytest.mark.parametrize(
    ("noise", "narrow", "verdict"),
    [
        (1e-7, 1e-2, "ok"),  # 0.5 % of atol + rtol*|1.0| = 2e-5
        (1.2e-5, 1e-2, "tight"),  # 60 %: another seed may fail a correct kernel
        (4e-5, 1e-2, "too_tight"),  # 200 %: the reference fails against itself in float64
        (1e-7, 1e-5, "loose"),  # the bfloat16 run passes: a precision bug would be certified
    ],
)
def test_each_verdict_follows_from_the_figures(noise, narrow, verdict):
    ref = np.array([1.0, -0.5], np.float32)
    truth = ref.astype(np.float64) + [noise, 0.0]
    narrows = [(ref.astype(np.float64) + [narrow, 0.0]).astype(np.float32)]
    assert judge_case([ref], [truth], narrows, 1e-5, 1e-5)["verdict"] == verdict


def test_no_float64_evaluation_means_uncalibrated_never_ok():
    ref = np.ones(4, np.float32)
    assert judge_case([ref], None, None, 1e-5, 1e-5)["verdict"] == "uncalibrated"


def noise_case(name: str, **figures) -> CaseNoise:
    """A float32 case at atol = rtol = 1e-5 judged ok, with the given figures (dims, noise)."""
    return CaseNoise(
        suite="compact",
        name=name,
        dtype="float32",
        profile="normal",
        atol=1e-5,
        rtol=1e-5,
        verdict="ok",
        **figures,
    )


def test_advice_spans_the_noise_and_the_bfloat16_error():
    def case(name, noise, narrow):
        return noise_case(name, noise_used=0.1, noise_scaled=noise, narrow_scaled=narrow)

    (advice,) = advise([case("a", 2e-7, 4e-3), case("b", 3.1e-7, 1e-2)])
    assert advice.at_least == pytest.approx(3e-6)  # 8 x 3.1e-7 = 2.48e-6, rounded up
    assert advice.at_most == pytest.approx(2e-3)  # 4e-3 / 2, rounded down


def test_fixed_dims_are_those_every_case_sets_to_one_value():
    def case(name, **dims):
        return noise_case(name, dims=dims)

    one = SpecNoise(spec="s", seed=0, suite="all", cases=[case("a", B=2, S=512)], advice=[])
    assert one.fixed_dims == {"B": 2, "S": 512}
    two = one.model_copy(update={"cases": [case("a", B=2, S=512), case("b", B=2, S=300)]})
    assert two.fixed_dims == {"B": 2}
    three = one.model_copy(update={"cases": [case("a", B=2, S=512), case("b", B=1, S=300)]})
    assert three.fixed_dims == {}


def test_ragged_dims_are_multiples_of_neither_8_nor_128():
    for value in (8, 64, 128, 256, 1024, 200, 3):
        assert ragged(value) % 8 != 0 and ragged(value) <= value


def test_the_tolerance_line_is_rewritten_in_place():
    text = "x = 1\n    tolerance={},\ny = 2\n"
    assert "tolerance={'float32': (3e-06, 3e-06)}," in with_tolerance(
        text, {"float32": (3e-6, 3e-6)}
    )


SUM_SPEC = """
import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    return jnp.cumsum(x, axis=-1)


def make_inputs(case, key):
    return (jax.random.normal(key, (case.dims["R"], case.dims["C"]), jnp.float32),)


SPEC = OpSpec(
    name="row_cumsum",
    category="scan",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {{"R": 8, "C": 4096}})],
    tolerance={{"float32": {tolerance}}},
)
"""


@pytest.mark.parametrize(
    ("tolerance", "code", "verdict", "said"),
    [
        ((1e-9, 1e-9), 1, "too_tight", "too tight: base (float32, atol=1e-09 rtol=1e-09)"),
        ((2.0, 2.0), 1, "loose", "too loose: base"),
        ((1e-4, 1e-4), 0, "ok", "verdict: ok"),
    ],
)
def test_spec_check_flags_a_tolerance_tighter_than_the_noise_or_loose_enough_to_hide_bf16(
    tmp_path, tolerance, code, verdict, said
):
    spec = tmp_path / "row_cumsum.py"
    spec.write_text(SUM_SPEC.format(tolerance=tolerance))
    result = run_cli("spec", "check", spec, "--seed", "5")
    assert result.returncode == code, result.stderr
    assert said in result.stdout
    as_json = run_cli("spec", "check", spec, "--seed", "5", "--json")
    (case,) = json.loads(as_json.stdout)["cases"]
    assert case["verdict"] == verdict
    assert case["noise_max_abs"] > 0  # a 4096-long float32 cumsum rounds, measurably


def test_spec_check_of_a_bundled_spec_passes_and_a_broken_spec_is_exit_2(tmp_path):
    result = run_cli("spec", "check", OPS / "layer_norm" / "spec.py", "--seed", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bf16" in result.stdout and "verdict: ok" in result.stdout
    assert "no case varies" not in result.stdout  # its ragged case varies both R and C
    broken = tmp_path / "broken.py"
    broken.write_text(SUM_SPEC.format(tolerance=(1e-4, 1e-4)).replace("jnp.cumsum", "jnp.nope"))
    result = run_cli("spec", "check", broken)
    assert result.returncode == 2
    assert "nope" in result.stderr and "Traceback" not in result.stderr


def _eps_in_a_loop(x):
    """An eps written twice: once at the top, once inside a loop body (a sub-computation)."""
    total = jax.lax.fori_loop(0, 2, lambda i, acc: acc + jnp.sum(x * x) + 1e-6, 0.0)
    return x / jnp.sqrt(total + 1e-5)


def test_a_small_constant_is_read_as_zero_wherever_it_is_written():
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    closed = jax.make_jaxpr(_eps_in_a_loop)(x)
    found = small_constants(closed, 1e-3)
    assert [round(v, 12) for v in found] == [1e-6, 1e-5]  # the loop's too; not 0, 1 or 2
    with _x64():
        kept = retyped_evaluation(closed, [x], np.float64)[0]
        dropped = retyped_evaluation(closed, [x], np.float64, frozenset(found))[0]
        zeros = retyped_evaluation(closed, [np.zeros_like(x)], np.float64, frozenset(found))[0]
    exact = x / np.sqrt(2 * np.sum(x.astype(np.float64) ** 2))
    np.testing.assert_allclose(dropped, exact, rtol=1e-12)
    assert not np.allclose(kept, dropped, rtol=1e-12, atol=0)
    assert np.isnan(zeros).all()  # 0 / sqrt(0): what the eps was there for


def test_spec_check_warns_of_an_eps_no_case_can_tell_from_zero():
    """JAX's rms norm spec as the wild set reused it: dropping its eps stays within tolerance
    (a held-out planted eps 1e-3 was 'repaired' by deleting it); its padded twin, with
    all-zero rows, tells them apart and gets no warning."""
    plain = run_cli("spec", "check", SHIPPED / "gpu_rms_norm_spec.py", "--seed", "3")
    assert plain.returncode == 0, plain.stderr
    assert "warning: the reference's constant 1e-05 can be left out" in plain.stdout
    # One case: nothing tells a kernel right only at its sizes from a right one (a warning,
    # not a problem: the exit stays 0).
    assert "warning: no case varies B, S, C (every case has B=2, S=8, C=256)" in plain.stdout
    padded = run_cli("spec", "check", SHIPPED / "gpu_norm_zero_rows_spec.py", "--seed", "3")
    assert padded.returncode == 0 and "can be left out" not in padded.stdout
    as_json = run_cli("spec", "check", SHIPPED / "gpu_norm_zero_rows_spec.py", "--json")
    (case,) = json.loads(as_json.stdout)["cases"]
    ((value, used),) = case["constants"]
    assert abs(value - 1e-5) < 1e-9 and (used is None or used > 1)  # NaN rows: infinitely far


REFERENCE = """
import jax.numpy as jnp

EPS = 1e-6


def rms_norm(x, w):
    xf = x.astype(jnp.float32)
    y = xf * (1 / jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + EPS))
    return (y * w.astype(jnp.float32)).astype(x.dtype)
"""


def test_spec_new_writes_a_spec_that_runs_with_a_measured_tolerance(tmp_path):
    (tmp_path / "ref.py").write_text(REFERENCE)
    out = tmp_path / "rms.py"
    result = run_cli(
        "spec",
        "new",
        out,
        "--reference",
        f"{tmp_path / 'ref.py'}:rms_norm",
        "--input",
        "x=R,C",
        "--input",
        "w=C",
        "--dims",
        "R=64,C=256",
        "--category",
        "normalization",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = out.read_text()
    assert "Case(\"ragged\", {'R': 55, 'C': 223})" in text
    assert 'dtype="bfloat16"' in text
    assert "tolerance={'bfloat16': (" in text and "'float32': (" in text
    # The written spec passes its own check.
    check = run_cli("spec", "check", out, "--seed", "9")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "x=R,C", "--dims", "R=4"], "--dims gives no size for C"),
        (["--input", "x=R", "--dims", "R=4,Q=2"], "no --input uses"),
        (["--input", "x=R", "--dims", "R=four"], "expected NAME=INT"),
        (["--input", "x", "--dims", "R=4"], "expected NAME=DIM"),
    ],
)
def test_spec_new_refuses_bad_input_in_one_line(tmp_path, args, message):
    (tmp_path / "ref.py").write_text(REFERENCE)
    out = tmp_path / "rms.py"
    result = run_cli("spec", "new", out, "--reference", f"{tmp_path / 'ref.py'}:rms_norm", *args)
    assert result.returncode == 2
    assert message in result.stderr and not out.exists()


def test_spec_new_refuses_a_missing_function_and_an_existing_file(tmp_path):
    (tmp_path / "ref.py").write_text(REFERENCE)
    out = tmp_path / "rms.py"
    common = ["--input", "x=R", "--dims", "R=4"]
    missing = run_cli("spec", "new", out, "--reference", f"{tmp_path / 'ref.py'}:nope", *common)
    assert missing.returncode == 2 and "defines no function 'nope'" in missing.stderr
    out.write_text("# mine\n")
    exists = run_cli("spec", "new", out, "--reference", f"{tmp_path / 'ref.py'}:rms_norm", *common)
    assert exists.returncode == 2 and out.read_text() == "# mine\n"


def test_spec_check_says_what_a_tpus_default_precision_dot_does_to_the_tolerance():
    # The matmul spec's float32 tolerance (1e-4) is far below one bfloat16 pass per dot; its
    # bfloat16 cases are exact in one pass and get no such line.
    result = run_cli("spec", "check", OPS / "matmul" / "spec.py", "--seed", "1", "--json")
    cases = {c["name"]: c for c in json.loads(result.stdout)["cases"]}
    assert cases["base"]["chip_used"] > 1 and cases["base"]["chip_max_abs"] > 1e-2
    assert cases["bf16"]["chip_used"] is None
    text = run_cli("spec", "check", OPS / "matmul" / "spec.py", "--seed", "1").stdout
    assert "TPU targets, float32: float32 dots at DEFAULT precision" in text
    assert "must ask for precision=HIGHEST" in text and "TPU targets, bfloat16" not in text
