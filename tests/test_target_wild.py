"""Target verdicts on kernels written the way JAX's own shipped Pallas kernels are.

Measured on JAX's modules as candidates, three verdicts were wrong for reasons that were not
the kernel's: splash attention's discarded m/l/o outputs (index map ``(0, 0)`` on a parallel
axis) judged a race; megablox gmm's grid, sized at run time, shown as
``[1, -9223372036854775808, 1]`` under a verdict that said "integrity"; and ``--target gpu`` on
a Triton-style kernel (``plgpu.CompilerParams``) a ``compile_error`` with an empty reason,
because the TPU lowering its grid was read from asserts on GPU compiler parameters. The kernels
here are small ones written for the purpose (``tests/planted/wild``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from conftest import PLANTED
from nearmiss.engine.check import check
from nearmiss.engine.integrity.grid import grid_findings
from nearmiss.engine.models import CheckReport, TargetResult
from nearmiss.engine.runner.traced_program import TracedProgram
from nearmiss.engine.targets import lowering_for, trim_exception
from nearmiss.engine.targets.tpu import export_for_tpu, without_tiling_rules
from nearmiss.reports.text import not_certified_because, render_report

WILD = PLANTED / "wild"
DOUBLE_SPEC = PLANTED / "tpu_spec" / "spec.py"
X = jax.ShapeDtypeStruct((64, 256), jnp.float32)


def _module(path: Path, **overrides):
    spec = importlib.util.spec_from_file_location(f"wild_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in overrides.items():
        setattr(module, name, value)
    return module


def _tpu_artifact(kernel, *avals):
    with lowering_for("tpu-v5e"):
        return jax.export.export(jax.jit(kernel), platforms=["tpu"])(*avals)


def _kinds(report):
    return [(f.kind, f.output) for f in report.findings]


# --- 1. an output nothing uses --------------------------------------------------------------


def test_a_discarded_statistics_output_revisited_on_a_parallel_axis_is_a_note_on_tpu():
    kernel = _module(WILD / "stats_discarded.py").kernel
    report = grid_findings(_tpu_artifact(kernel, X), "tpu")
    assert report.ok, (report.findings, report.undetermined)
    assert [o.unused for o in report.kernels[0].outputs] == [True, False]
    assert len(report.notes) == 1 and "nothing uses that output" in report.notes[0]
    assert report.as_dict()["notes"] == report.notes


def test_the_same_statistics_used_by_the_program_are_still_a_race():
    kernel = _module(WILD / "stats_used.py").kernel
    report = grid_findings(_tpu_artifact(kernel, X), "tpu")
    assert _kinds(report) == [("parallel_revisit", 0)] and not report.notes
    assert [o.unused for o in report.kernels[0].outputs] == [False, False]


def test_an_unused_output_is_still_a_race_under_gpu_semantics():
    # Concurrent GPU programs can read back what another wrote to a global output block.
    kernel = _module(WILD / "stats_discarded.py").kernel
    report = grid_findings(_tpu_artifact(kernel, X), "gpu")
    assert ("grid_race", 0) in _kinds(report)


def _aliased_body(x_ref, s_in_ref, stats_ref, o_ref):
    stats_ref[...] = jnp.maximum(s_in_ref[...], jnp.max(x_ref[...]))
    o_ref[...] = x_ref[...] * 2.0


def test_an_unused_output_aliased_to_an_input_counts_as_used():
    def kernel(x, stats):
        _, out = pl.pallas_call(
            _aliased_body,
            grid=(8,),
            in_specs=[
                pl.BlockSpec((8, 256), lambda i: (i, 0)),
                pl.BlockSpec((8, 128), lambda i: (0, 0)),
            ],
            out_specs=[
                pl.BlockSpec((8, 128), lambda i: (0, 0)),
                pl.BlockSpec((8, 256), lambda i: (i, 0)),
            ],
            out_shape=[
                jax.ShapeDtypeStruct((8, 128), jnp.float32),
                jax.ShapeDtypeStruct((64, 256), jnp.float32),
            ],
            input_output_aliases={1: 0},
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x, stats)
        return out

    stats = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    report = grid_findings(_tpu_artifact(kernel, X, stats), "tpu")
    assert ("parallel_revisit", 0) in _kinds(report) and not report.notes


def test_check_certifies_discarded_statistics_for_tpu_and_refuses_used_ones():
    report = check(DOUBLE_SPEC, WILD / "stats_discarded.py", "compact", 3, targets=("tpu-v5e",))
    tpu = report.targets["tpu-v5e"]
    assert report.certified, (report.diagnosis, tpu)
    assert tpu.ok and not tpu.findings and any("nothing uses" in n for n in tpu.notes)
    assert "note: output 0 of kernel" in render_report(report)

    report = check(DOUBLE_SPEC, WILD / "stats_used.py", "compact", 3, targets=("tpu-v5e",))
    tpu = report.targets["tpu-v5e"]
    assert all(c.passed for c in report.cases)
    assert not report.certified and tpu.failure_class == "grid_race"
    assert [f["kind"] for f in tpu.findings] == ["parallel_revisit"] and not tpu.notes


# --- 2. a grid sized at run time ------------------------------------------------------------


def test_a_dynamic_grid_is_shown_with_question_marks_and_a_plain_reason():
    kernel = _module(WILD / "dynamic_grid.py").kernel
    report = grid_findings(_tpu_artifact(kernel, X), "tpu")
    assert not report.ok and not report.findings
    (reason,) = [u["reason"] for u in report.undetermined]
    assert reason.startswith("dynamic grid [?]: the grid's size is computed at run time")
    assert "-9223372036854775808" not in reason


def test_check_says_unverified_for_a_dynamic_grid_in_the_target_and_the_verdict():
    report = check(DOUBLE_SPEC, WILD / "dynamic_grid.py", "compact", 3, targets=("tpu-v5e",))
    tpu = report.targets["tpu-v5e"]
    assert all(c.passed for c in report.cases) and report.integrity.ok
    assert not report.certified and not tpu.ok and tpu.failure_class is None
    assert report.failure_class is None
    text = render_report(report)
    assert "target tpu-v5e: FAIL unverified" in text
    assert "verdict: NOT CERTIFIED — unverified on tpu-v5e" in text
    assert "integrity" not in text.split("verdict:")[1].splitlines()[0]
    assert "tpu-v5e: unverified: compact-base: dynamic grid [?]" in report.diagnosis


def _report(**fields) -> CheckReport:
    base = dict(
        op="op",
        category="c",
        spec="s.py",
        candidate="k.py",
        suite="compact",
        seed=1,
        platform="cpu",
        jax_version="0",
        certified=False,
    )
    return CheckReport(**(base | fields))


def test_the_verdict_names_what_stopped_certification():
    unverified = TargetResult(ok=False, verified_by="x", undetermined=["k: dynamic grid [?]"])
    assert not_certified_because(_report(targets={"tpu-v5e": unverified})) == (
        "unverified on tpu-v5e"
    )
    assert not_certified_because(_report(failure_class="grid_race")) == "grid_race"
    violated = _report(targets={"tpu-v5e": unverified})
    violated.integrity.violations = [{"rule": "r", "detail": "d"}]
    assert not_certified_because(violated) == "integrity"


# --- 3. --target gpu on a Triton-style kernel -----------------------------------------------


def _gpu_grid(kernel):
    program = TracedProgram.trace(kernel, [X])
    with without_tiling_rules():
        data = export_for_tpu(
            program.function(interpret=False, grid_only=True), [X], "tpu-v5e", jaxpr=program.jaxpr
        )
    return grid_findings(jax.export.deserialize(bytearray(data)), "gpu")


def test_a_triton_kernels_grid_is_read_without_its_body_or_gpu_compiler_params():
    report = _gpu_grid(_module(WILD / "triton_rows.py").kernel)
    assert report.ok, (report.findings, report.undetermined)
    assert report.kernels[0].grid == [64]
    assert report.kernels[0].outputs[0].varies_along == [0]

    report = _gpu_grid(_module(WILD / "triton_rows.py", RACE=True).kernel)
    assert _kinds(report) == [("grid_race", 0)] and report.findings[0].axes == [1]


def test_check_judges_a_triton_kernel_for_gpu_by_its_grid():
    report = check(DOUBLE_SPEC, WILD / "triton_rows.py", "compact", 3, targets=("gpu",))
    gpu = report.targets["gpu"]
    assert report.certified, (report.diagnosis, gpu)

    report = check(DOUBLE_SPEC, WILD / "triton_race.py", "compact", 3, targets=("gpu",))
    gpu = report.targets["gpu"]
    assert all(c.passed for c in report.cases)
    assert not report.certified and gpu.failure_class == "grid_race"


def test_an_exception_without_a_message_still_gives_a_reason():
    def lower():  # JAX's `assert isinstance(compiler_params, tpu_core.CompilerParams)`
        raise AssertionError  # (pytest rewrites a plain assert here to carry a message)

    try:
        lower()
    except AssertionError as exc:
        reason = trim_exception(exc)
    assert reason.startswith("AssertionError raised without a message in lower"), reason
    assert "test_target_wild.py" in reason and "raise AssertionError" in reason
