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
    scaled_error,
    tolerance_used,
)
from nearmiss.engine.authoring.spec_new import parse_input, ragged, with_tolerance
from nearmiss.engine.runner.arrays import float_eps
from nearmiss.engine.runner.retype import (
    pinned_evaluation,
    retyped_evaluation,
    rounding_steps,
    small_constants,
)
from nearmiss.engine.spec import load_spec

SHIPPED = Path(__file__).parent / "shipped"
QUANTISED = Path(__file__).parent / "planted" / "quantised"


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
        (
            ["--input", "x=R:int4", "--dims", "R=4"],
            "unknown dtype 'int4'; expected one of float64, float32, float16, bfloat16, int8",
        ),
    ],
)
def test_spec_new_refuses_bad_input_in_one_line(tmp_path, args, message):
    (tmp_path / "ref.py").write_text(REFERENCE)
    out = tmp_path / "rms.py"
    result = run_cli("spec", "new", out, "--reference", f"{tmp_path / 'ref.py'}:rms_norm", *args)
    assert result.returncode == 2
    assert message in result.stderr and not out.exists()
    assert result.stderr.count("\n") == 1


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


# ---- quantised references and integer outputs ----


def test_the_float64_run_of_a_quantised_reference_keeps_its_own_rounding():
    """Float64 rounds thousands of bfloat16 values of x / scale the other way: a difference of
    whole quanta that no kernel rounding as the reference does shows, and that `spec check` read
    as noise ("too tight", a suggested tolerance of 3). Kept, what is left is the arithmetic."""
    spec = load_spec(QUANTISED / "qmatmul_spec.py")
    case = next(c for c in spec.extended if c.dtype == "bfloat16")
    inputs = spec.make_inputs(case, jax.random.PRNGKey(0))
    reference = np.asarray(spec.reference(*inputs))
    closed = jax.make_jaxpr(spec.reference)(*inputs)
    assert rounding_steps(closed) == (2, 0)  # round, and the cast to int8
    arrays = [np.asarray(a) for a in inputs]
    with _x64():
        afresh = retyped_evaluation(closed, arrays, np.float64)[0]
        kept = pinned_evaluation(closed, arrays, np.float64)[0]
    eps = float_eps(ml_dtypes.bfloat16)
    assert scaled_error(kept, reference) < eps  # within the bfloat16 output's own rounding
    assert scaled_error(afresh, reference) > 10 * eps  # flipped quanta


def test_a_rounding_inside_a_loop_is_counted_and_its_flips_are_not_called_too_tight():
    def looped(x):
        return jax.lax.fori_loop(0, 2, lambda i, acc: acc + jnp.round(x), jnp.zeros_like(x))

    closed = jax.make_jaxpr(looped)(jnp.ones(4, jnp.float32))
    assert rounding_steps(closed) == (0, 1)
    ref = np.array([1.0, -0.5], np.float32)
    flipped = ref.astype(np.float64) + [1.0, 0.0]  # one value rounded the other way
    assert judge_case([ref], [flipped], None, 1e-5, 1e-5)["verdict"] == "too_tight"
    judged = judge_case([ref], [flipped], None, 1e-5, 1e-5, rounding_in_loops=1)
    assert judged["verdict"] == "uncalibrated"


def test_advice_for_integer_outputs_is_zero_and_for_exact_ones_says_so():
    integer = noise_case("a", noise_scaled=0.0, noise_max_abs=0.0, outputs=["int32"])
    integer = integer.model_copy(update={"output_max_abs": 3e5})
    (advice,) = advise([integer])
    assert (advice.basis, advice.at_least) == ("integer", 0.0)
    assert advice.integer_slack == 3  # 1e-5 + 1e-5 * 3e5 = 3.00001: off by 3 passes
    exact = noise_case(
        "b", noise_scaled=0.0, noise_max_abs=0.0, outputs=["float32"], output_rounding=6e-8
    )
    (advice,) = advise([exact])
    assert advice.basis == "exact" and advice.at_least == pytest.approx(5e-7)  # 8 x 6e-8
    noisy = exact.model_copy(update={"noise_max_abs": 1e-7, "noise_scaled": 1e-7})
    assert advise([exact, noisy])[0].basis == "noise"


def test_spec_check_of_a_quantised_reference_measures_the_arithmetic_not_flipped_roundings():
    result = run_cli("spec", "check", QUANTISED / "qmatmul_spec.py", "--seed", "4", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    cases = json.loads(result.stdout)["cases"]
    assert {c["name"] for c in cases} == {"base", "bf16", "small"}
    for case in cases:
        assert case["rounding_steps"] == 2 and case["rounding_in_loops"] == 0
        assert case["verdict"] in ("ok", "tight"), case
        assert case["noise_used"] <= 1
    text = run_cli("spec", "check", QUANTISED / "qmatmul_spec.py", "--seed", "4").stdout
    assert "quantised reference: it rounds floats to integers (2 steps)" in text
    assert "too tight" not in text and "none fits" not in text


def test_a_kernel_rounding_as_the_quantised_reference_does_matches_it_exactly():
    report = json.loads(
        run_cli(
            "check",
            QUANTISED / "qmatmul_spec.py",
            QUANTISED / "qmatmul_golden.py",
            "--suite",
            "compact",
            "--seed",
            "4",
            "--json",
        ).stdout
    )
    assert report["certified"], report["diagnosis"]
    exact = [c for c in report["cases"] if c["dtype"] == "float32"]
    assert exact and all(leaf["max_abs_error"] == 0 for c in exact for leaf in c["leaves"])


def test_spec_check_of_integer_outputs_suggests_exact_comparison():
    spec = QUANTISED / "int_matmul_spec.py"
    result = run_cli("spec", "check", spec, "--seed", "2", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    noise = json.loads(result.stdout)
    assert all(c["outputs"] == ["int32"] and c["verdict"] == "ok" for c in noise["cases"])
    (advice,) = noise["advice"]
    # float32's default 1e-5 relative, on int32 sums of int8 products over K=512 (to ~8e5 at
    # this seed): several units of slack.
    assert advice["basis"] == "integer" and advice["integer_slack"] >= 1
    text = run_cli("spec", "check", spec, "--seed", "2").stdout
    assert "every output is an integer array, compared exactly" in text
    assert "suggested atol = rtol = 0" in text and "off by up to" in text


EXACT_SPEC = """
import jax
import jax.numpy as jnp

from nearmiss.engine.spec import Case, OpSpec


def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.int32).astype(jnp.float32) * 0.5


def make_inputs(case, key):
    ka, kb = jax.random.split(key)
    shape = (case.dims["M"], case.dims["M"])
    a = jax.random.randint(ka, shape, -128, 128, jnp.int32).astype(jnp.int8)
    return a, jax.random.randint(kb, shape, -128, 128, jnp.int32).astype(jnp.int8)


SPEC = OpSpec(
    name="halved_int_matmul",
    category="matmul",
    reference=reference,
    make_inputs=make_inputs,
    compact=[Case("base", {"M": 64}), Case("small", {"M": 16})],
)
"""


def test_spec_check_says_when_the_reference_agrees_exactly_with_float64(tmp_path):
    spec = tmp_path / "halved.py"
    spec.write_text(EXACT_SPEC)
    result = run_cli("spec", "check", spec, "--seed", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "float32: the outputs agree exactly with the float64 computation on every case" in (
        result.stdout
    )
    assert "verdict: ok" in result.stdout


def test_an_input_may_name_its_dtype():
    assert parse_input("x=M,N") == ("x", ("M", "N"), None)
    assert parse_input("w=K,N:int8") == ("w", ("K", "N"), "int8")
    assert parse_input("s=:int32") == ("s", (), "int32")


QUANTISED_REFERENCE = """
import jax
import jax.numpy as jnp


def quantized_matmul(x, w_q, w_scale):
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127
    x_q = jnp.clip(jnp.round(x / scale), -128, 127).astype(jnp.int8)
    acc = jax.lax.dot_general(
        x_q, w_q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )
    return (acc.astype(jnp.float32) * scale.astype(jnp.float32) * w_scale).astype(x.dtype)


def masked_int_matmul(a, b, lengths):
    out = jnp.dot(a, b, preferred_element_type=jnp.int32)
    return jnp.where(jnp.arange(out.shape[0])[:, None] < lengths[0], out, 0)


def shifted(x):
    return (x + 3000.0) - 3000.0
"""


def _spec_new(tmp_path, function, *args):
    (tmp_path / "ref.py").write_text(QUANTISED_REFERENCE)
    out = tmp_path / f"{function}.py"
    reference = f"{tmp_path / 'ref.py'}:{function}"
    return out, run_cli("spec", "new", out, "--reference", reference, *args)


def test_spec_new_gives_inputs_their_dtypes_and_states_each_tolerance_and_why(tmp_path):
    out, result = _spec_new(
        tmp_path,
        "quantized_matmul",
        *("--input", "x=M,K", "--input", "w_q=N,K:int8", "--input", "w_scale=N:float32"),
        *("--dims", "M=32,N=128,K=256", "--category", "matmul"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    spec = load_spec(out)
    for case in spec.compact + spec.extended:
        x, w_q, w_scale = spec.make_inputs(case, jax.random.PRNGKey(0))
        assert (x.dtype, w_q.dtype, w_scale.dtype) == (case.dtype, jnp.int8, jnp.float32)
        assert int(w_q.min()) < -100 and int(w_q.max()) > 100  # int8's whole range
    assert {c.dtype for c in spec.extended} == {"float32", "bfloat16"}
    said = result.stderr.splitlines()
    assert "input w_q (int8): integers drawn from [-128, 128), its whole range" in said
    for dtype in ("float32", "bfloat16"):
        (line,) = [s for s in said if s.startswith(f"tolerance {dtype}: atol=")]
        assert "8x the reference's own noise against float64" in line
        atol = float(line.split("atol=")[1].split()[0])
        assert 0 < atol <= (1e-3 if dtype == "float32" else 0.1)  # no 0.7, no 5
        assert f"'{dtype}': ({atol:g}, {atol:g})" in out.read_text()
    assert "WARNING" not in result.stderr


def test_spec_new_writes_zero_tolerance_for_integer_outputs(tmp_path):
    out, result = _spec_new(
        tmp_path,
        "masked_int_matmul",
        *("--input", "a=M,K:int8", "--input", "b=K,N:int8", "--input", "lengths=L:int32"),
        *("--dims", "M=16,N=128,K=64,L=1"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tolerance={'float32': (0, 0)}," in out.read_text()
    assert 'Case("bf16"' not in out.read_text()  # no input follows the case's dtype
    assert "INTEGER_RANGES = {'a': (-128, 128), 'b': (-128, 128), 'lengths': (0, 128)}" in (
        out.read_text()
    )
    said = result.stderr.splitlines()
    assert (
        "tolerance float32: atol=0 rtol=0: every output is an integer array (int32): a correct "
        "kernel matches it exactly"
    ) in said
    assert any(s.startswith("input lengths (int32)") and "INTEGER_RANGES" in s for s in said)


def test_spec_new_says_loudly_when_the_measured_tolerance_is_beyond_rounding(tmp_path):
    # (x + 3000) - 3000 cancels: bfloat16 keeps nothing of x, float64 all of it.
    out, result = _spec_new(tmp_path, "shifted", "--input", "x=R,C", "--dims", "R=8,C=128")
    assert result.returncode == 1, result.stdout + result.stderr
    (warning,) = [s for s in result.stderr.splitlines() if s.startswith("WARNING")]
    assert "for bfloat16 cases is above anything bfloat16 rounding explains" in warning
    assert out.exists()  # written, and said
