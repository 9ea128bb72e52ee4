"""A check on a machine whose GPU answers, as far as it can be tested without one.

The ``gpu`` target on such a machine runs the whole check there (``targets.run_platform``):
every child sandboxed with the GPU's device nodes and the CUDA toolkit XLA compiles with, the
kernel compiled for the GPU, the cases' own numbers the target's verdict. What only the GPU can
say was measured on an H200 with ``infra/gpu_engine_check.sh`` (docs/gpu.md, "Measured on
an H200"); here: the decisions, the sandbox's view of the toolkit, and that script's dry run,
escape attempt included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import OPS, ROOT
from nearmiss.engine.check import check, device_verdict
from nearmiss.engine.errors import UsageError, last_error_line
from nearmiss.engine.models import CaseResult, ErrorInfo
from nearmiss.engine.runner import environment
from nearmiss.engine.runner.target_plan import lowerings, plan_targets
from nearmiss.engine.targets import registry

SCRIPT = ROOT / "infra" / "gpu_engine_check.py"


@pytest.fixture
def gpu_answers(monkeypatch):
    monkeypatch.setattr(registry, "_gpu_backend", lambda: ("cuda", ""))


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(registry, "_gpu_backend", lambda: (None, "no GPU backend"))


def test_without_a_gpu_every_check_runs_on_the_cpu(no_gpu):
    assert registry.run_platform(None) == "cpu"
    assert registry.run_platform(("interpret",)) == "cpu"
    assert registry.run_platform(("gpu",)) == "cpu"  # judged by grid semantics instead


def test_with_a_gpu_the_gpu_target_alone_runs_there(gpu_answers):
    assert registry.run_platform(("gpu",)) == "cuda"
    assert registry.run_platform(("interpret",)) == "cpu"
    # With targets that mean CPU interpret mode or a TPU compiler: the CPU, and grid semantics
    assert registry.run_platform(("tpu-v5e", "gpu")) == "cpu"
    assert registry.run_platform(["GPU", "gpu"]) == "cuda"  # named as check() would parse it


def test_a_gpu_check_never_falls_back_to_emulation(gpu_answers):
    """Told a GPU answers where none does, the check's children are started for that device
    only: the check fails, loudly, instead of certifying in CPU interpret mode."""
    with pytest.raises(UsageError, match="the spec's child failed"):
        check(
            OPS / "silu_mul" / "spec.py",
            OPS / "silu_mul" / "golden.py",
            "compact",
            0,
            targets=("gpu",),
        )


def test_on_the_device_the_gpu_target_lowers_nothing_more_and_says_what_it_ran():
    on_device = plan_targets(("gpu",), on_device=True)
    assert lowerings(on_device) == []
    assert "run there" in on_device[0].verified_by
    grid_only = plan_targets(("gpu",))
    assert lowerings(grid_only) == ["gpu-grid"]
    assert "Triton" in grid_only[0].verified_by and "no GPU run" in grid_only[0].verified_by


def _case(name: str, passed: bool, **fields) -> CaseResult:
    return CaseResult(
        suite="compact", name=name, dims={}, dtype="float32", profile="", passed=passed, **fields
    )


def test_the_device_target_verdict_is_the_cases_compiler_refusal_included():
    assert device_verdict("ran there", [_case("a", True), _case("b", True)]).ok
    refused = ErrorInfo(phase="compile", type="NotImplementedError", message="scratch memory")
    verdict = device_verdict(
        "ran there",
        [_case("a", True), _case("b", False, failure_class="compile_error", error=refused)],
    )
    assert not verdict.ok
    assert verdict.failure_class == "compile_error"
    assert verdict.error == "1/2 cases fail; compact/b: NotImplementedError: scratch memory"
    assert not device_verdict("ran there", []).ok  # nothing ran: nothing accepted


def _link_chain(tmp_path: Path) -> tuple[Path, Path, Path]:
    """visible/cuda -> hidden/alternatives/cuda -> /usr/lib: the GPU machine's
    /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-13.0, in small."""
    visible, hidden = tmp_path / "visible", tmp_path / "hidden" / "alternatives"
    visible.mkdir()
    hidden.mkdir(parents=True)
    (hidden / "cuda").symlink_to("/usr/lib")
    (visible / "cuda").symlink_to(hidden / "cuda")
    return visible, visible / "cuda", hidden / "cuda"


def test_only_the_links_a_sandbox_would_lack_are_recreated(tmp_path):
    visible, home, hidden_link = _link_chain(tmp_path)
    assert environment.links_to_recreate(str(home), [visible]) == [("/usr/lib", str(hidden_link))]
    assert environment.links_to_recreate(str(home), [visible, hidden_link.parent]) == []
    # A relative link in a folder reached through a folder link resolves from the real folder.
    (tmp_path / "real").mkdir()
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "deep" / "er")
    (tmp_path / "deep" / "er" / "x").symlink_to("../../real")
    assert environment.links_to_recreate(str(tmp_path / "via" / "x"), []) == [
        (str(tmp_path / "real"), str(tmp_path / "via" / "x"))
    ]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert environment.links_to_recreate(str(loop), []) == [(str(loop), str(loop))]


def test_a_device_child_sees_cudas_home_through_its_links(tmp_path, monkeypatch):
    """The effect, in a real bubblewrap sandbox: the link outside what it shows resolves in a
    child with devices, and does not exist in one without."""
    sandbox = environment.find_sandbox()
    if isinstance(sandbox, str):
        pytest.fail(sandbox)  # the suite installs bubblewrap (make setup)
    _, _, hidden_link = _link_chain(tmp_path)
    monkeypatch.setattr(environment, "CUDA_HOMES", (str(hidden_link),))
    home = tmp_path / "home"
    home.mkdir()
    env = environment.child_environment(home, {})
    code = f"import os; print(os.path.isdir({str(hidden_link)!r}))"
    seen = {}
    for devices in (True, False):
        argv = sandbox.command([sys.executable, "-c", code], home, env, devices=devices)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen[devices] = done.stdout.strip()
    assert seen == {True: "True", False: "False"}


def test_a_toolkit_that_would_show_home_or_the_project_is_never_chosen(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda"
    (toolkit / "bin").mkdir(parents=True)
    for tool in ("ptxas", "nvlink"):
        (toolkit / "bin" / tool).write_text("")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert environment.cuda_toolkit.__wrapped__() == toolkit
    monkeypatch.setattr(Path, "home", lambda: toolkit / "home")  # the toolkit would show $HOME
    assert environment.cuda_toolkit.__wrapped__() != toolkit


def test_a_device_child_finds_the_toolkits_tools_first_on_its_path(monkeypatch):
    monkeypatch.setattr(environment, "cuda_toolkit", lambda: Path("/usr/local/cuda-13.0"))
    env = environment.device_environment({"PATH": "/usr/bin:/bin"})
    assert env["PATH"] == "/usr/local/cuda-13.0/bin:/usr/bin:/bin"
    monkeypatch.setattr(environment, "cuda_toolkit", lambda: None)
    assert environment.device_environment({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


def test_a_dead_childs_error_is_its_last_line_not_jaxs_note():
    tail = (
        "Traceback (most recent call last):\n  File x\n"
        "jax.errors.JaxRuntimeError: INTERNAL: libdevice not found at ./libdevice.10.bc\n"
        "--------------------\n"
        "For simplicity, JAX has removed its internal frames from the traceback of the "
        "following exception. Set JAX_TRACEBACK_FILTERING=off to include these.\n"
    )
    line = last_error_line(tail)
    assert line.endswith("INTERNAL: libdevice not found at ./libdevice.10.bc")
    assert last_error_line("") == ""


def _dry_run(tmp_path: Path, **env_extra: str) -> dict:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | env_extra
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--ops", "silu_mul", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.end_to_end
def test_the_device_scripts_dry_run_checks_and_its_escape_attempt_is_contained(tmp_path):
    result = _dry_run(tmp_path)
    assert result["machine"]["run_platform"] == "cpu"
    (checked,) = result["checks"]
    assert checked["certified"] and checked["times"] == "emulated"
    assert checked["targets"]["interpret"]["ok"]
    assert (tmp_path / "checks" / "silu_mul-golden.json").is_file()
    escape = result["escape"]
    assert escape["passed"] and len(escape["markers_tried"]) == 3
    assert escape["markers_found"] == []
    # The control: unsandboxed, the same candidate leaves its markers (the script removes them).
    unsafe = _dry_run(tmp_path, NEARMISS_UNSAFE_NO_SANDBOX="1")["escape"]
    assert unsafe["markers_found"] == unsafe["markers_tried"]
    assert not any(os.path.exists(p) for p in unsafe["markers_tried"])
