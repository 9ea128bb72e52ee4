"""Targets and the TPU compile-only toolchain, with the real libtpu (no TPU needed, no mocks).

The two sides run in two fresh processes, as in a check: the candidate's side lowers kernels with
Pallas' TPU lowering and writes serialized artifacts; the executor's side, which never imports a
kernel, compiles those bytes with libtpu for a compile-only topology device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import OPS, PLANTED, ROOT
from nearmiss.engine.errors import UsageError
from nearmiss.engine.targets import (
    TARGETS,
    available_targets,
    kernel_sites,
    parse_targets,
    prepare_environment,
    trim_error,
)
from nearmiss.engine.targets.registry import TPU_TARGETS

GOLDEN = OPS / "softmax_rows" / "golden.py"
MISALIGNED = PLANTED / "tpu_misaligned_block.py"
PALLAS_CALL_LINE = next(
    n for n, line in enumerate(MISALIGNED.read_text().splitlines(), 1) if "pl.pallas_call(" in line
)
BODY_LINE = next(
    n for n, line in enumerate(MISALIGNED.read_text().splitlines(), 1) if "def _double" in line
)

CANDIDATE_SIDE = r"""
import json, sys
from pathlib import Path
from nearmiss.engine.targets import prepare_environment
prepare_environment()
import importlib.util
import jax
from jax import export
from jax.experimental import pallas as pl
from nearmiss.engine.targets import export_for_tpu, trim_exception
from nearmiss.engine.targets.registry import TPU_TARGETS

out, golden_path, misaligned_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def load(path):
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

x = [jax.ShapeDtypeStruct((64, 256), "float32")]
golden, misaligned = load(golden_path), load(misaligned_path)
for target in TPU_TARGETS:
    (out / f"golden-{target}.bin").write_bytes(export_for_tpu(golden.kernel, x, target))
report = {}
try:
    export_for_tpu(misaligned.kernel, x, "tpu-v5e")
except ValueError as exc:
    report["lowering_error"] = trim_exception(exc, misaligned_path)
# What a hostile candidate can do in its own process: switch the lowering's block check off.
from jax._src.pallas.mosaic import lowering
lowering._check_block_mappings = lambda *args, **kwargs: None
(out / "bypassed.bin").write_bytes(export_for_tpu(misaligned.kernel, x, "tpu-v5e"))
# A pallas_call built in interpret mode lowers to plain HLO: no Mosaic kernel in the artifact.
def interpreted(v):
    def body(i_ref, o_ref):
        o_ref[...] = i_ref[...]
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype), interpret=True)(v)
(out / "interpreted.bin").write_bytes(export_for_tpu(interpreted, x, "tpu-v5e"))
cpu = export.export(jax.jit(lambda v: v * 2), platforms=["cpu"])(*x)
(out / "cpu.bin").write_bytes(bytes(cpu.serialize()))
report["libtpu_loaded"] = "libtpu" in open("/proc/self/maps").read()
print(json.dumps(report))
"""

EXECUTOR_SIDE = r"""
import json, sys
from pathlib import Path
from nearmiss.engine.targets import prepare_environment
prepare_environment()
from nearmiss.engine.targets import compile_tpu_artifact
from nearmiss.engine.targets.registry import TPU_TARGETS

out, name = Path(sys.argv[1]), sys.argv[2]
report = {
    t: compile_tpu_artifact((out / f"golden-{t}.bin").read_bytes(), t, "golden.py")
    for t in TPU_TARGETS
}
for artifact in ("bypassed", "interpreted", "cpu"):
    report[artifact] = compile_tpu_artifact((out / f"{artifact}.bin").read_bytes(), "tpu-v5e", name)
report["garbage"] = compile_tpu_artifact(b"not an artifact", "tpu-v5e")
report["modules"] = sorted(m for m in sys.modules if m == "candidate" or "golden" in m)
print(json.dumps(report))
"""


def _child(code: str, *args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmpdir))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=tmpdir,
    )


@pytest.fixture(scope="module")
def toolchain(tmp_path_factory) -> dict:
    """Both sides once: what the candidate's side reported, what the executor compiled."""
    out = tmp_path_factory.mktemp("artifacts")
    scratch = tmp_path_factory.mktemp("scratch")
    lowered = _child(CANDIDATE_SIDE, str(out), str(GOLDEN), str(MISALIGNED), tmpdir=scratch)
    assert lowered.returncode == 0, lowered.stderr
    compiled = _child(EXECUTOR_SIDE, str(out), MISALIGNED.name, tmpdir=scratch)
    assert compiled.returncode == 0, compiled.stderr
    return {
        "lowered": json.loads(lowered.stdout.splitlines()[-1]),
        "compiled": json.loads(compiled.stdout.splitlines()[-1]),
        "stderr": lowered.stderr + compiled.stderr,
        "scratch": sorted(p.name for p in scratch.iterdir()),
    }


# -- names -----------------------------------------------------------------------------------------


def test_parse_targets_keeps_order_and_drops_repeats():
    assert parse_targets("interpret,tpu-v5e") == ("interpret", "tpu-v5e")
    assert parse_targets(" TPU-v6e , interpret,tpu-v6e,") == ("tpu-v6e", "interpret")
    assert parse_targets(["gpu"]) == ("gpu",)
    assert set(TARGETS) == {"interpret", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu"}


@pytest.mark.parametrize("text", ["tpu-v7", "interpret,cuda", "", " , "])
def test_unknown_or_no_target_is_one_line_usage_error(text):
    with pytest.raises(UsageError) as raised:
        parse_targets(text)
    message = str(raised.value)
    assert "\n" not in message and "interpret, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, gpu" in message


def test_tpu_target_without_a_working_libtpu_says_what_to_install(tmp_path):
    """A libtpu without its library (a broken install) shadows the real one: a TPU target is a
    one-line usage error naming `make setup`; other targets and the import stay cheap."""
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("")
    code = (
        "import sys, nearmiss.engine.targets as t\n"
        "assert 'jax' not in sys.modules and 'libtpu' not in sys.modules\n"
        "print(t.parse_targets('interpret,gpu'))\n"
        "t.parse_targets('interpret,tpu-v5e')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert "('interpret', 'gpu')" in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("nearmiss.engine.errors.UsageError: TPU targets need libtpu"), (
        done.stderr
    )
    assert "run `make setup` (installs jax[tpu] matching jax " in last


def test_available_targets_include_the_tpu_generations():
    available = available_targets()
    assert available[0] == "interpret"
    assert "tpu-v5e" in available
    assert set(TPU_TARGETS) <= set(available)


def test_probe_is_quiet_and_leaves_no_files(tmp_path):
    """libtpu on a CPU host, compile-only: no warnings on stderr, no logs or lock files, and
    every topology's devices are of the kind the registry lowers for."""
    done = _child(
        "import runpy; runpy.run_module('nearmiss.engine.targets.probe', run_name='__main__')",
        "tpu",
        tmpdir=tmp_path,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    answer = json.loads(done.stdout)
    assert answer["errors"] == {}
    for name in TPU_TARGETS:
        assert answer["topologies"][TARGETS[name].topology] == TARGETS[name].device_kind
    assert list(tmp_path.iterdir()) == []


def test_prepare_environment_sets_defaults_and_keeps_explicit_settings():
    env = prepare_environment({"TPU_MIN_LOG_LEVEL": "0", "TMPDIR": "/scratch"})
    assert env["TPU_MIN_LOG_LEVEL"] == "0"
    assert env["TPU_WORKER_HOSTNAMES"] == "localhost" and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    assert env["TPU_LOG_DIR"] == "/scratch" and env["JAX_PLATFORMS"] == "cpu"
    assert "JAX_PLATFORMS" not in prepare_environment({}, cpu_only=False)


# -- export -> compile ----------------------------------------------------------------------------


def test_golden_compiles_for_every_tpu_generation(toolchain):
    assert toolchain["lowered"]["libtpu_loaded"] is False  # lowering needs JAX only
    assert toolchain["compiled"]["modules"] == []  # the executor imported no kernel
    for target in TPU_TARGETS:
        result = toolchain["compiled"][target]
        assert result["ok"], result
        assert result["failure_class"] is None and result["error"] is None
        assert result["kernels"] == 1 and result["compile_s"] > 0
        memory = result["memory"]
        assert memory["argument_bytes"] == memory["output_bytes"] == 64 * 256 * 4
        assert memory["code_bytes"] > 0 and memory["temp_bytes"] >= 0


def test_misaligned_block_refused_at_lowering_with_the_candidates_lines(toolchain):
    error = toolchain["lowered"]["lowering_error"]
    assert len(error) <= 400
    assert "divisible by 8 and 128" in error and "block shape (8, 64)" in error
    assert f"{MISALIGNED.name}:{BODY_LINE}" in error  # Pallas names the kernel body
    assert f"pallas_call of _double at {MISALIGNED.name}:{PALLAS_CALL_LINE}" in error
    assert "index_map" not in error and "https://" not in error


def test_compiler_refuses_what_a_bypassed_lowering_let_through(toolchain):
    """Mosaic checks the block tiling again: the executor refuses the kernel by itself."""
    result = toolchain["compiled"]["bypassed"]
    assert not result["ok"] and result["failure_class"] == "compile_error"
    assert "CompileTimeMosaicMisalignedBlockAndTiling" in result["error"]
    assert f"{MISALIGNED.name}:{PALLAS_CALL_LINE}" in result["error"]
    assert len(result["error"]) <= 400


def test_artifacts_without_a_mosaic_kernel_are_refused(toolchain):
    compiled = toolchain["compiled"]
    assert "no Mosaic kernel" in compiled["interpreted"]["error"]
    assert "['cpu'], not ['tpu']" in compiled["cpu"]["error"]
    assert "does not deserialize" in compiled["garbage"]["error"]
    for name in ("interpreted", "cpu", "garbage"):
        assert compiled[name]["failure_class"] == "compile_error" and not compiled[name]["ok"]


def test_both_sides_are_quiet_and_leave_no_files(toolchain):
    assert toolchain["stderr"] == ""
    assert toolchain["scratch"] == []


# -- trimming (messages as libtpu 0.0.42 and jax 0.10.2 give them) ---------------------------------

MOSAIC_ALIGNMENT = """INTERNAL: Mosaic failed to compile TPU kernel: E2003: \
CompileTimeMosaicUnprovenMemoryAccessAlignment: cannot statically prove that index in dimension 1 \
is a multiple of 8
See https://openxla.org/xla/errors/error_2003 for more details.

The MLIR operation involved:
  %40 = "tpu.vector_load"(%arg1, %5, %39, %5) <{operandSegmentSizes = array<i32: 1, 3, 0>}> : \
(memref<4x34x50xbf16, #tpu.memory_space<vmem>>, index, index, index) -> vector<4x8x48xbf16>

Please report a bug at: https://github.com/jax-ml/jax/issues/new/choose
at location: loc("get:"("get/get"(callsite("_conv_body"("/sandbox/home/candidate.py":17:17 to \
:66) at "_conv_body"("/sandbox/home/candidate.py":17:17 to :66)))))"""

VMEM_OOM = """RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:
Ran out of memory in memory space vmem while allocating on stack for %kernel.1 = \
f32[4096,4096]{1,0:T(8,128)} custom-call(%args_0_.1), custom_call_target="tpu_custom_call", \
metadata={op_name="jit(call)/call_exported/jit(kernel)/pallas_call" stack_frame_id=5}. Scoped \
allocation with size 128.00M and limit 16.00M exceeded scoped vmem limit by 112.00M. It should \
not be possible to run out of scoped vmem -
See https://openxla.org/xla/errors/error_1001 for more details."""


def test_trim_keeps_the_finding_and_the_mlir_location_of_the_candidate():
    trimmed = trim_error(MOSAIC_ALIGNMENT, "candidate.py")
    assert trimmed == (
        "Mosaic: E2003: CompileTimeMosaicUnprovenMemoryAccessAlignment: cannot statically prove "
        "that index in dimension 1 is a multiple of 8 (at candidate.py:17)"
    )


def test_trim_drops_the_hlo_dump_and_falls_back_to_the_kernel_site():
    trimmed = trim_error(VMEM_OOM, "candidate.py", sites=["pallas_call of _body at candidate.py:9"])
    assert trimmed == (
        "E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem while "
        "allocating on stack. Scoped allocation with size 128.00M and limit 16.00M exceeded "
        "scoped vmem limit by 112.00M. (pallas_call of _body at candidate.py:9)"
    )


def test_trim_bounds_any_message():
    trimmed = trim_error("x" * 5000 + ". More.", "candidate.py", frames=[("/a/candidate.py", 3)])
    assert len(trimmed) <= 400 and trimmed.endswith("(at candidate.py:3)")


def test_kernel_sites_walk_a_forged_location_graph_once():
    """An artifact's locations may be forged: a DAG that doubles at every level is walked
    node by node, not path by path."""
    lines = ['%0 = stablehlo.custom_call @tpu_custom_call(%a) {kernel_name = "k"} loc(#loc90)']
    lines.append('#loc0 = loc("/elsewhere/candidate.py":5:1)')
    lines += [f"#loc{i} = loc(callsite(#loc{i - 1} at #loc{i - 1}))" for i in range(1, 91)]
    assert kernel_sites("\n".join(lines), "candidate.py") == ["pallas_call of k at candidate.py:5"]
