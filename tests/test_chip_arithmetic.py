"""The chip's arithmetic on a CPU (``runner.chip_arithmetic``) and the TPU-semantics run's
arbitrary fill (``runner.tpu_semantics``): what each rewrite computes, checked against the
arithmetic it stands for, in-process (no sandbox: these are the engine's own functions on a
traced program)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from nearmiss.engine.runner.chip_arithmetic import on_the_chip
from nearmiss.engine.runner.tpu_semantics import arbitrary_values, fill_arbitrary


def on_chip(f, *args):
    """``f(*args)`` as the chip computes it, and what the rewrite changed."""
    closed = jax.make_jaxpr(f)(*args)
    rewritten, found = on_the_chip(closed)
    return np.asarray(jax.core.eval_jaxpr(rewritten.jaxpr, rewritten.consts, *args)[0]), found


@pytest.fixture
def operands():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((128, 32)).astype(np.float32)
    return a, b


def bf16(x):
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def test_a_default_precision_dot_is_one_pass_over_bfloat16_operands(operands):
    a, b = operands
    out, found = on_chip(lambda x, y: jnp.dot(x, y), a, b)
    np.testing.assert_allclose(out, bf16(a) @ bf16(b), rtol=1e-5, atol=1e-4)
    assert np.abs(out - a.astype(np.float64) @ b).max() > 1e-2  # far from float32's answer
    assert [(r["precision"], r["passes"], r["in_kernel"]) for r in found.reduced] == [
        ("DEFAULT", 1, False)
    ]


def test_high_precision_is_three_passes_between_one_and_float32(operands):
    a, b = operands
    exact = a.astype(np.float64) @ b
    one, _ = on_chip(lambda x, y: jnp.dot(x, y), a, b)
    three, found = on_chip(lambda x, y: jnp.dot(x, y, precision=lax.Precision.HIGH), a, b)
    assert found.reduced[0]["passes"] == 3
    assert 0 < np.abs(three - exact).max() < np.abs(one - exact).max() / 50


def test_highest_and_non_float32_dots_are_left_as_they_are(operands):
    a, b = operands
    _, found = on_chip(lambda x, y: jnp.dot(x, y, precision=lax.Precision.HIGHEST), a, b)
    assert found.reduced == []
    half = (jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16))
    _, found = on_chip(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32), *half)
    assert found.reduced == []


def test_outside_kernels_the_configured_default_precision_counts(operands):
    a, b = operands
    with jax.default_matmul_precision("float32"):
        _, found = on_chip(lambda x, y: jnp.dot(x, y), a, b)
    assert found.reduced == []


def test_a_shift_by_the_bit_width_in_a_kernel_is_reported_with_its_line():
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] << (32 + 0 * pl.program_id(0))

    def kernel(x):
        return pl.pallas_call(body, grid=(1,), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jnp.ones((8, 128), jnp.int32)
    closed = jax.make_jaxpr(kernel)(x)
    params = pltpu.InterpretParams(detect_races=False, uninitialized_memory="nan")
    from nearmiss.engine.runner.traced_program import retargeted

    rewritten, found = on_the_chip(retargeted(closed, params))
    jax.block_until_ready(jax.core.eval_jaxpr(rewritten.jaxpr, rewritten.consts, x))
    assert [u["what"] for u in found.undefined] == [
        "a shift by 32 or more (or by a negative amount) of a 32-bit integer"
    ]
    assert "test_chip_arithmetic.py" in found.undefined[0]["line"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
def test_arbitrary_values_are_finite_seeded_and_of_every_kind(dtype):
    draw = lambda seed: arbitrary_values(np.random.default_rng(seed), (64, 128), dtype)  # noqa: E731
    first, again, other = draw(1), draw(1), draw(2)
    assert first.dtype == np.dtype(jnp.dtype(dtype)) and first.shape == (64, 128)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    if dtype in ("float32", "bfloat16"):
        values = first.astype(np.float64)
        assert np.isfinite(values).all() and (values < 0).any() and (values > 0).any()
        assert (np.abs(values) >= 2.0**-4 * 0.99).all()  # never 0: a sum that adds one shows


def test_the_fill_points_are_put_back_after_the_run():
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as calls
    from jax._src.pallas.mosaic.interpret import utils

    before = (utils.get_uninitialized_array, utils.pad_to_block_dimension, calls._get_with_padding)
    with fill_arbitrary(3):
        assert utils.get_uninitialized_array is not before[0]
    assert (
        utils.get_uninitialized_array,
        utils.pad_to_block_dimension,
        calls._get_with_padding,
    ) == before


def tf32(x):
    """``x`` as a GPU's tensor cores read a float32 operand in TF32: its top 19 bits."""
    bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32).astype(np.float64)


def test_on_a_gpu_a_default_or_high_precision_dot_reads_tf32_operands(operands):
    a, b = operands
    for precision in (None, lax.Precision.HIGH):
        closed = jax.make_jaxpr(lambda x, y, p=precision: jnp.dot(x, y, precision=p))(a, b)
        rewritten, found = on_the_chip(closed, gpu=True)
        out = np.asarray(jax.core.eval_jaxpr(rewritten.jaxpr, rewritten.consts, a, b)[0])
        np.testing.assert_allclose(out, tf32(a) @ tf32(b), rtol=1e-5, atol=1e-4)
        assert np.abs(out - a.astype(np.float64) @ b).max() > 1e-3  # not float32's answer
        assert [entry["passes"] for entry in found.reduced] == ["tf32"]
    closed = jax.make_jaxpr(lambda x, y: jnp.dot(x, y, precision=lax.Precision.HIGHEST))(a, b)
    rewritten, found = on_the_chip(closed, gpu=True)
    assert rewritten is closed and not found.reduced


def test_an_emulation_the_engine_could_not_make_is_undetermined_not_the_kernels_fault():
    from nearmiss.engine.targets.verdict import judge_target

    run = {"passed": False, "error": "ValueError: the engine could not emulate the target: x"}
    case = {
        "key": "compact-base",
        "exported": True,
        "lowered": {"ok": True},
        "grid": {"findings": []},
        "semantics": dict(run, emulation_failed=True),
    }
    result = judge_target("tpu-v5e", "emulated", "tpu-v5e", False, [case])
    assert not result.ok and result.failure_class is None and result.undetermined
    case["semantics"] = run  # the same error from the kernel's own run: counted against it
    result = judge_target("tpu-v5e", "emulated", "tpu-v5e", False, [case])
    assert result.failure_class == "runtime_error"


@pytest.mark.parametrize(("fill", "numerics"), [("nan", "chip"), ("arbitrary", "exact")])
def test_cases_of_one_shape_share_a_compile_and_each_gets_its_own_outputs(tmp_path, fill, numerics):
    """A hidden case's values scaled: the same shapes, so the TPU-semantics run compiles once,
    and the second case's outputs are its own, not the first's."""
    from pathlib import Path

    from nearmiss.engine.runner import tpu_semantics
    from nearmiss.engine.runner.arrays import load_arrays, save_arrays
    from nearmiss.engine.runner.candidate_child import import_candidate, traced_program
    from nearmiss.engine.runner.protocol import OUTPUT_FILE

    golden = Path(__file__).resolve().parents[1] / "pallas_ops" / "softmax_rows" / "golden.py"
    module = import_candidate(str(golden), "shared_compile_softmax")
    x = np.random.default_rng(1).standard_normal((24, 128)).astype(np.float32)
    compiled_before = len(tpu_semantics._COMPILED)
    for scale in (1.0, 4.0):
        case = tmp_path / f"x{scale:g}"
        case.mkdir()
        save_arrays(case / "inputs.npz", [x * scale])
        request = {"dir": str(case), "suite": "hidden", "name": case.name, "target": "tpu-v5e"}
        result = tpu_semantics.run_under_tpu_semantics(
            lambda shapes: traced_program(module.kernel, shapes),
            {**request, "seed": 5, "fill": fill, "numerics": numerics},
        )
        assert result["ok"], result
        (out,), _ = load_arrays(case / OUTPUT_FILE)
        expected = np.asarray(jax.nn.softmax(x * scale, axis=-1))
        np.testing.assert_allclose(out, expected, rtol=2e-2 if numerics == "chip" else 1e-5)
    assert len(tpu_semantics._COMPILED) == compiled_before + 1
