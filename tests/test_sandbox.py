"""Candidate code can crash, hang, allocate without end or snoop; the caller survives."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (
    OPS,
    PLANTED,
    ROOT,
    SOFTMAX_SPEC,
    check_json,
    kept_folders,
    processes_under,
    run_cli,
)
from nearmiss.engine.check import check
from nearmiss.engine.errors import UsageError
from nearmiss.engine.runner.environment import UNSAFE_ENV, child_environment, isolation_level
from nearmiss.engine.runner.sandbox import Limits, SandboxChild
from nearmiss.engine.runner.session import describe_spec
from nearmiss.engine.runner.spec_sandbox import REFERENCE_MODULE


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """Sandbox homes go under tmp_path, so a test can see whether anything was left behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def compact(candidate: str, **limits) -> tuple:
    started = time.monotonic()
    # The gate only reports: these kernels are hostile on purpose and must reach the sandbox.
    report = check(
        SOFTMAX_SPEC, PLANTED / candidate, "compact", 1, Limits(**limits), integrity="report"
    )
    return report, report.cases[0], time.monotonic() - started


def test_a_hanging_kernel_is_killed_and_reported_as_timeout(private_tmp):
    report, case, elapsed = compact("hang.py", case_timeout_s=3)
    assert case.failure_class == "timeout" and report.failure_class == "timeout"
    assert "3 s" in case.diagnosis
    assert elapsed < 60
    assert processes_under(private_tmp) == []
    # Every sandbox directory removed but a kept one's.
    assert set(private_tmp.iterdir()) <= kept_folders()


def test_a_hang_at_import_is_a_timeout_for_every_case(private_tmp):
    report = check(
        SOFTMAX_SPEC,
        PLANTED / "hang_at_import.py",
        "all",
        1,
        Limits(startup_timeout_s=5),
        integrity="report",
    )
    assert {c.failure_class for c in report.cases} == {"timeout"} and len(report.cases) >= 3
    assert "importing the candidate" in report.cases[0].diagnosis
    assert processes_under(private_tmp) == []


def test_a_segfault_is_a_runtime_error_pointing_at_the_line():
    _, case, _ = compact("segfault.py")
    assert case.failure_class == "runtime_error"
    assert "SIGSEGV" in case.diagnosis
    assert case.error.location == "segfault.py:7"


def test_os_exit_at_import_is_a_finding():
    _, case, _ = compact("exit_at_import.py")
    assert case.failure_class == "runtime_error"
    assert "exited with status 3" in case.diagnosis


def test_exceptions_and_syntax_errors_at_import_are_compile_errors_with_the_line():
    _, case, _ = compact("raise_at_import.py")
    assert case.failure_class == "compile_error"
    assert case.error.location == "raise_at_import.py:3"
    assert "KeyError" in case.diagnosis
    _, case, _ = compact("syntax_error.py")
    assert case.failure_class == "compile_error"
    assert case.error.location == "syntax_error.py:6"


def test_a_memory_bomb_hits_the_limit_and_the_caller_survives(private_tmp):
    _, case, elapsed = compact("memory_bomb.py", memory_mb=1536)
    assert case.failure_class == "runtime_error"
    assert "memory" in case.diagnosis.lower()
    assert elapsed < 120
    assert processes_under(private_tmp) == []


def test_the_child_environment_is_an_allowlist():
    parent = {
        "PATH": "/bin",
        "OPENAI_API_KEY": "k",
        "DATABASE_URL": "postgres://u:p@h/d",
        "PGPASSWORD": "p",
        "JAX_PLATFORMS": "cpu",
        "AWS_SECRET_ACCESS_KEY": "s",
        "NEARMISS_DSN": "postgres://x",
        "HOME": "/root",
    }
    env = child_environment(Path("/tmp/home"), parent)
    assert env["JAX_PLATFORMS"] == "cpu" and env["PATH"] == "/bin"
    assert env["HOME"] == env["TMPDIR"] == "/tmp/home"
    for secret in (
        "OPENAI_API_KEY",
        "DATABASE_URL",
        "PGPASSWORD",
        "AWS_SECRET_ACCESS_KEY",
        "NEARMISS_DSN",
    ):
        assert secret not in env


def test_the_engines_processes_start_one_blas_thread_unless_told_otherwise():
    """OpenBLAS's threads spin as NumPy loads: a child and the command ask for one, and a
    number the user's environment names is kept."""
    assert child_environment(Path("/h"), {})["OPENBLAS_NUM_THREADS"] == "1"
    assert (
        child_environment(Path("/h"), {"OPENBLAS_NUM_THREADS": "3"})["OPENBLAS_NUM_THREADS"] == "3"
    )

    def the_commands_threads(env: dict[str, str]) -> list[str]:
        """The number asked for and the threads running, in a process that loads the command."""
        count = (
            "import os, nearmiss.cli.main, numpy; "
            "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))"
        )
        said = subprocess.run(
            [sys.executable, "-c", count], env=env, capture_output=True, text=True, check=True
        )
        return said.stdout.split()

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert the_commands_threads(env) == ["1", "1"]  # NumPy loaded, and no other thread
    assert the_commands_threads({**env, "OPENBLAS_NUM_THREADS": "2"})[0] == "2"


MARKER = "planted-marker-7731"


def run_secret_probe(env: dict) -> tuple[int, dict]:
    # With the gate enforced the probe never runs at all (its imports are forbidden); in
    # report mode it runs, and the sandbox alone must keep the secret from it.
    return check_json(
        SOFTMAX_SPEC,
        PLANTED / "secret_probe.py",
        "--suite",
        "compact",
        "--integrity",
        "report",
        env=env,
    )


def test_a_secret_in_the_callers_environment_never_reaches_the_candidate():
    env = dict(os.environ, OPENAI_API_KEY=MARKER, DATABASE_URL=f"postgres://u:{MARKER}@h/db")
    env.pop(UNSAFE_ENV, None)
    code, report = run_secret_probe(env)
    # The probe also reads every /proc/PID/environ: bubblewrap's own PID namespace hides the
    # engine's. Without the sandbox the check would have refused to run the candidate.
    assert report["isolation"] == isolation_level()
    assert report["isolation"].startswith("bubblewrap")
    # The probe's output is not poisoned: it saw no secret.
    assert report["cases"][0]["passed"], report["diagnosis"]
    assert {v["rule"] for v in report["integrity"]["violations"]} >= {"forbidden_import"}


def test_with_the_gate_enforced_a_credential_reader_never_runs(tmp_path):
    sink = Path("/tmp/nearmiss-stolen.txt")  # where the cheat would write what it read
    sink.unlink(missing_ok=True)
    env = dict(os.environ, OPENAI_API_KEY=MARKER)
    code, report = check_json(
        SOFTMAX_SPEC, OPS / "integrity" / "cheats" / "credential_reader.py", env=env
    )
    assert code == 1 and report["cases"] == []
    assert "not executed" in report["diagnosis"]
    assert report["integrity"]["violations"][0]["rule"] == "forbidden_import"
    assert not sink.exists()


def test_the_secret_probe_does_see_what_is_passed_through():
    # Control for the test above: an allowlisted variable does reach the candidate, and the
    # probe then poisons its output, so a leak would have been caught.
    env = dict(os.environ, TZ=MARKER)
    code, report = run_secret_probe(env)
    assert code == 1 and report["failure_class"] == "nan_inf"


def test_interpret_mode_is_forced_even_for_calls_built_at_import():
    report, case, _ = compact("built_at_import.py")
    assert case.passed and report.passed, case.diagnosis


def test_forged_messages_on_the_engine_pipe_are_a_finding_not_a_crash():
    report, case, _ = compact("forged_messages.py")
    assert not report.certified
    assert case.failure_class == "runtime_error"
    assert (
        "unexpected message" in case.diagnosis
        or "malformed" in case.diagnosis
        or "unusable result" in case.diagnosis
    )


GOLDEN = OPS / "softmax_rows" / "golden.py"


def without_bwrap(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no bwrap, with its own temp dir."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "scratch").mkdir()
    env = dict(os.environ, PATH=str(tmp_path / "bin"), TMPDIR=str(tmp_path / "scratch"))
    env.pop(UNSAFE_ENV, None)
    return env


def test_without_bubblewrap_candidates_are_refused_in_one_line(tmp_path):
    env = without_bwrap(tmp_path)
    result = run_cli("check", SOFTMAX_SPEC, GOLDEN, "--suite", "compact", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "bwrap" in lines[0] and "not installed" in lines[0]
    assert "apt-get install bubblewrap" in lines[0] and "--unsafe-no-sandbox" in lines[0]
    assert result.stdout == ""
    assert list((tmp_path / "scratch").iterdir()) == []  # nothing left behind


def test_a_bwrap_that_cannot_start_a_sandbox_is_refused_with_its_reason(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.delenv(UNSAFE_ENV, raising=False)
    assert isolation_level() == "none"
    with pytest.raises(UsageError) as refused:
        check(SOFTMAX_SPEC, GOLDEN, "compact", 1)
    message = str(refused.value)
    assert "\n" not in message
    assert "cannot start a sandbox here (bwrap: setting up uid map: Permission denied)" in message
    assert "--unsafe-no-sandbox" in message


def test_unsafe_no_sandbox_runs_candidates_unsandboxed_and_says_so(tmp_path):
    env = without_bwrap(tmp_path)
    result = run_cli(
        "check", SOFTMAX_SPEC, GOLDEN, "--suite", "compact", "--json", "--unsafe-no-sandbox",
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["isolation"] == "none (unsafe)"
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert warnings and "WITHOUT a sandbox" in warnings[0]


HANGING_SPEC = """
import jax
from nearmiss.engine.spec import Case, OpSpec


def reference(x):
    while True:  # a spec bug: the reference never returns
        pass


def make_inputs(case, key):
    return (jax.random.normal(key, (8, 128)),)


SPEC = OpSpec(name="hangs", category="other", reference=reference, make_inputs=make_inputs,
              compact=[Case("base", {})])
"""


def test_the_timeout_bounds_the_candidates_import_and_the_specs_work(private_tmp, tmp_path):
    limits = Limits(case_timeout_s=2, startup_allowance_s=3)
    started = time.monotonic()
    report = check(
        SOFTMAX_SPEC, PLANTED / "hang_at_import.py", "compact", 1, limits, integrity="report"
    )
    assert [c.failure_class for c in report.cases] == ["timeout"]
    assert "within 5 s" in report.cases[0].diagnosis
    spec = tmp_path / "hanging_spec.py"
    spec.write_text(HANGING_SPEC)
    with pytest.raises(UsageError, match="the spec's child failed: no answer within 5 s"):
        check(spec, OPS / "softmax_rows" / "golden.py", "compact", 1, limits)
    assert time.monotonic() - started < 60


def test_the_specs_child_keeps_its_compiled_programs_for_the_next_check(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(cache))
    first = check(SOFTMAX_SPEC, OPS / "softmax_rows" / "golden.py", "compact", 0)
    stored = sorted(p.name for p in (cache / "jax-reference").iterdir())
    assert first.certified
    assert any(name.endswith("-cache") for name in stored), stored  # JAX's entries
    again = check(SOFTMAX_SPEC, OPS / "softmax_rows" / "golden.py", "compact", 0)
    assert again.certified
    assert again.cases[0].leaves == first.cases[0].leaves  # same inputs, same numbers
    monkeypatch.setenv("NEARMISS_CACHE_DIR", "off")
    assert check(SOFTMAX_SPEC, OPS / "softmax_rows" / "golden.py", "compact", 0).certified


def test_the_engine_reads_a_specs_name_without_running_the_spec_itself(tmp_path):
    marker = tmp_path / "spec-ran-here"
    spec = tmp_path / "spec.py"
    source = (SOFTMAX_SPEC).read_text()
    # The spec leaves a mark where it runs: never in the engine's process or on the host (in
    # the sandbox the marker's directory does not even exist).
    mark = f"try:\n    open({str(marker)!r}, 'w').close()\nexcept OSError:\n    pass\n"
    spec.write_text(mark + source)
    described = describe_spec(spec)
    assert described["name"] == "softmax_rows" and described["category"]
    assert not marker.exists()
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no spec here')\n")
    with pytest.raises(UsageError, match="no spec here"):
        describe_spec(broken)


def test_a_child_closed_twice_closes_its_pipes_once():
    child = SandboxChild(REFERENCE_MODULE, Path(tempfile.mkdtemp(prefix="nearmiss-t-")), Limits())
    try:
        child.close()
        reused = os.pipe()  # most likely the numbers the child's pipes had
        child.close()
        assert all(os.fstat(fd) for fd in reused)  # still open: not closed by the second call
        for fd in reused:
            os.close(fd)
    finally:
        shutil.rmtree(child.home, ignore_errors=True)


# An engine that starts a fresh candidate child (the candidate named at start, as a check does
# without spares) and dies at once, before bwrap has bound the sandbox to it: a worker's SIGKILL
# or the OOM killer at the wrong moment.
ENGINE_DIES_AS_ITS_CHILD_STARTS = """
import os, sys
from pathlib import Path
from nearmiss.engine.runner.candidate_child import CANDIDATE_ENV
from nearmiss.engine.runner.sandbox import Limits, SandboxChild
home = Path(sys.argv[1])
SandboxChild("nearmiss.engine.runner.candidate_child", home, Limits(),
             extra_env={CANDIDATE_ENV: str(home / "kernel.py")})
os._exit(0)
"""
RUNS_FOR_EVER = (
    "import pathlib, time\n"
    "while True:\n"
    "    pathlib.Path('ran').write_text(str(time.time()))\n"
    "    time.sleep(0.05)\n"
)


def _working_in(home: Path) -> list[int]:
    """Processes whose command line names ``home`` (bwrap) or whose working directory it is."""
    named = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(home) in command:
            named.append(int(entry))
    return sorted(set(named) | set(processes_under(home)))


@pytest.mark.parametrize("sandboxed", [True, False], ids=["bubblewrap", "unsafe-no-sandbox"])
def test_a_candidate_whose_engine_died_as_its_child_started_never_runs(tmp_path, sandboxed):
    """Before: the sandbox outlived its engine and ran the candidate unwatched, for ever (every
    time). Now the child sees that nobody holds the other end of its pipe and exits first."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "kernel.py").write_text(RUNS_FOR_EVER)
    env = dict(os.environ)
    env.pop(UNSAFE_ENV, None)
    if not sandboxed:
        env[UNSAFE_ENV] = "1"
    engine = subprocess.run(
        [sys.executable, "-c", ENGINE_DIES_AS_ITS_CHILD_STARTS, str(home)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert engine.returncode == 0, engine.stderr
    deadline = time.monotonic() + 20  # a candidate would be running by then: JAX is in ~1 s
    while _working_in(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _working_in(home)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, (home / "child.log").read_text(errors="replace")
    assert not (home / "ran").exists()


# A candidate that swaps its log for a link to a host file, then dies: the engine quotes the log
# of a child that died, and read it again by its path, in a directory the child can write.
LOG_SWAPPED_FOR_A_LINK = """
import typing
os = typing.sys.modules["importlib"].import_module("os")
os.unlink("child.log")
os.symlink({target!r}, "child.log")
os._exit(3)


def kernel(x):
    return x
"""


def test_a_log_swapped_for_a_link_never_reads_a_host_file_into_the_report(tmp_path):
    """Before: the canary (and, through /proc/self/environ, the engine's secrets) came back in
    the diagnosis, which the fix model reads."""
    canary = f"nearmiss-canary-{os.urandom(8).hex()}"
    secret = tmp_path / "secret.txt"
    secret.write_text(f"Evidence: {canary}\n")
    secret.chmod(0o600)
    for target in (str(secret), "/proc/self/environ"):
        candidate = tmp_path / "swap_log.py"
        candidate.write_text(LOG_SWAPPED_FOR_A_LINK.format(target=target))
        env = dict(os.environ, NEARMISS_TEST_CANARY=canary)
        code, report = check_json(
            SOFTMAX_SPEC, candidate, "--suite", "compact", "--integrity", "report", env=env
        )
        assert code == 1 and not report["certified"]
        assert canary not in json.dumps(report), target
        assert secret.read_text() == f"Evidence: {canary}\n"  # and nothing written to it


# A correct kernel that, at import, plants links where the engine files a case's inputs into the
# candidate's home (checked with a TPU target, the engine copies inputs there for the run under
# TPU semantics) and where it creates the case's folder.
LINKS_IN_THE_HOME = """
import typing
os = typing.sys.modules["importlib"].import_module("os")
os.makedirs("cases/compact-base", exist_ok=True)
os.symlink({victim!r}, "cases/compact-base/inputs.npz")
os.symlink({folder!r}, "cases/compact-other")
"""


def test_links_a_candidate_plants_in_its_home_are_never_followed_on_the_host(tmp_path):
    """Before: the host file was replaced by the case's inputs (as the engine's user: root in
    CI), and a case folder was created in the host folder a link named."""
    victim = tmp_path / "precious.conf"
    victim.write_text("keep me\n")
    folder = tmp_path / "host-folder"
    folder.mkdir()
    candidate = tmp_path / "links.py"
    planted = LINKS_IN_THE_HOME.format(victim=str(victim), folder=str(folder))
    candidate.write_text(planted + GOLDEN.read_text())
    result = run_cli(
        "check", SOFTMAX_SPEC, candidate, "--suite", "compact", "--target", "tpu-v5e",
        "--integrity", "report", "--json", "--seed", "7",
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    assert victim.read_text() == "keep me\n"
    assert list(folder.iterdir()) == []


# A correct kernel that, at import, has the child it runs in file a case's outputs as a named pipe
# instead of an npz. The engine opened that file by path: reading a pipe nobody writes to blocks
# for ever, and the whole check with it.
# (The engine's own modules are out of reach while candidate code runs: ``runner.plain_import``.
# NumPy is shared, and the child files outputs with it.)
OUTPUTS_AS_A_PIPE = """
import typing
import numpy as _np
_os = typing.sys.modules["importlib"].import_module("os")
_savez = _np.savez
def _pipe_instead(file, *args, **kwargs):
    name = str(getattr(file, "name", file))
    if name.endswith("output.npz"):
        file.close()
        _os.unlink(name)
        _os.mkfifo(name)
        return None
    return _savez(file, *args, **kwargs)
_np.savez = _pipe_instead
"""


def test_outputs_a_candidate_files_as_a_pipe_are_refused_not_waited_on(tmp_path):
    """Before: the check under TPU semantics never finished (the engine blocked on the pipe)."""
    candidate = tmp_path / "pipe.py"
    candidate.write_text(OUTPUTS_AS_A_PIPE + GOLDEN.read_text())
    result = run_cli(
        "check", SOFTMAX_SPEC, candidate, "--suite", "compact", "--target", "tpu-v5e",
        "--integrity", "report", "--json", "--seed", "7", timeout=180,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert not report["certified"]
    assert "output.npz (not a regular file)" in result.stdout


# Reads a 1 GB-when-expanded arrays file (deflated zeros, 1 MB on disk, as a candidate's child can
# file its outputs) and prints what happened and how far the read raised the reader's peak
# resident size, in MB.
LOAD_A_BOMB = """
import resource, sys, zipfile, zlib
import numpy as np
from nearmiss.engine.runner.arrays import _META_KEY as META, load_arrays
header = __import__("io").BytesIO()
np.lib.format.write_array_header_1_0(
    header, {"descr": "|u1", "fortran_order": False, "shape": (1 << 30,)}
)
meta = __import__("io").BytesIO()
np.save(meta, np.frombuffer(b'{"dtypes": ["uint8"], "extra": {}}', dtype=np.uint8))
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as archive:
    archive.writestr(f"{META}.npy", meta.getvalue())
    with archive.open("a0.npy", "w", force_zip64=True) as member:
        member.write(header.getvalue())
        zeros = bytes(16 << 20)
        for _ in range(64):
            member.write(zeros)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_arrays(sys.argv[1])
    outcome = "loaded"
except ValueError as exc:
    outcome = f"refused: {exc}"
print(outcome, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_compressed_arrays_file_is_refused_before_it_expands(tmp_path):
    """Before: the reader allocated and filled the whole expanded array (peak over 1 GB)."""
    result = subprocess.run(
        [sys.executable, "-c", LOAD_A_BOMB, str(tmp_path / "output.npz")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    outcome, grown_mb = result.stdout.rsplit(" ", 1)
    assert outcome.startswith("refused: a compressed member"), outcome
    assert int(grown_mb) < 256, grown_mb


# A correct kernel whose import sends the engine a message nested deeper than Python's parser
# recurses. The engine's reader raised RecursionError, which nothing caught: the check crashed.
NESTED_MESSAGE = """
import typing
_os = typing.sys.modules["importlib"].import_module("os")
# The engine's end: the one pipe this process holds open for writing (fdinfo flags & 3 == 1).
_pipes = [int(fd) for fd in _os.listdir("/proc/self/fd") if _os.path.exists(f"/proc/self/fd/{fd}")
          and _os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")]
_write = [fd for fd in _pipes
          if int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8) & 3 == 1]
_os.write(_write[0], b"[" * 200000 + b"\\n")
"""


def test_a_message_nested_too_deep_is_the_childs_failure_not_the_engines(tmp_path):
    candidate = tmp_path / "nested.py"
    candidate.write_text(NESTED_MESSAGE + GOLDEN.read_text())
    code, report = check_json(
        SOFTMAX_SPEC, candidate, "--suite", "compact", "--integrity", "report"
    )
    assert code == 1 and not report["certified"]
    assert "nested too deeply" in report["cases"][0]["diagnosis"], report["cases"][0]["diagnosis"]
