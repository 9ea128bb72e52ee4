"""`nearmiss repair` at its edges: a busy port, a signal, a deadline, --json's stderr, a diff
that did not certify."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, slow

from conftest import OPS, ROOT, private_stack, run_cli
from infra.devstack import PostgresService, TemporalService, pid_alive, port_open
from nearmiss.client.service import UNCERTIFIED_HEADER, _report, progress_line
from workflows.loop import Guards, LoopState, RepairLoop
from workflows.models import RepairResult, TokenUsage
from workflows.repair import Progress

SOFTMAX = OPS / "softmax_rows"
SEARCH = Path(__file__).parent / "search"
# How long after its deadline a session may end (the server's timer, a workflow task).
GRACE_S = 5


def _embedded_env(config, tmp: Path) -> dict[str, str]:
    """The environment of a command that starts its own stack, with a temp dir of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TEMPORAL_ADDRESS", "NEARMISS_DATABASE_URL")
    }
    tmp.mkdir(exist_ok=True)
    env.update(
        NEARMISS_HOME=str(config.home),
        NEARMISS_TEMPORAL_PORT=str(config.temporal_port),
        NEARMISS_POSTGRES_PORT=str(config.postgres_port),
        TMPDIR=str(tmp),
    )
    return env


@pytest.mark.parametrize(
    ("service", "variable"),
    [("temporal", "NEARMISS_TEMPORAL_PORT"), ("postgres", "NEARMISS_POSTGRES_PORT")],
)
def test_a_busy_port_is_one_line_naming_the_setting_and_starts_nothing(tmp_path, service, variable):
    config = private_stack(tmp_path / "state")
    port = config.temporal_port if service == "temporal" else config.postgres_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        env = _embedded_env(config, tmp_path / "tmp")
        result = run_cli("repair", SOFTMAX / "spec.py", SOFTMAX / "golden.py", env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("nearmiss: error:")]
    assert len(errors) == 1 and f"port {port} is in use" in errors[0], result.stderr
    assert variable in errors[0]
    # Nothing was started: neither service has a live process, neither port answers.
    assert TemporalService(config).pid() is None and PostgresService(config).pid() is None
    assert not port_open(config.temporal_port) and not port_open(config.postgres_port)


def sigterm_once_started(tmp_path: Path, args: list[str], started: str) -> tuple[int, str, str]:
    """Run ``nearmiss ARGS`` on an embedded stack of its own, send SIGTERM once a stderr line
    starts with ``started`` (both services answer by then), and return its exit status, stdout
    and stderr after asserting that nothing it started is left: no Temporal or PostgreSQL
    process, no port answering, no scratch directory."""
    config = private_stack(tmp_path / "state")
    tmp = tmp_path / "tmp"
    env = _embedded_env(config, tmp)
    command = [sys.executable, "-m", "nearmiss.cli", *args]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        said = []
        for line in process.stderr:
            said.append(line)
            if line.startswith(started):
                break
        temporal, postgres = TemporalService(config).pid(), PostgresService(config).pid()
        assert temporal is not None and postgres is not None, "".join(said)
        process.send_signal(signal.SIGTERM)
        out, rest = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        PostgresService(config).stop()
        TemporalService(config).stop()
        PostgresService(config).remove_data()
    said_all = "".join(said) + rest
    assert "Traceback" not in rest, said_all
    assert not pid_alive(temporal) and not pid_alive(postgres)
    assert not port_open(config.temporal_port) and not port_open(config.postgres_port)
    assert list(tmp.iterdir()) == []  # no scratch directory left behind
    return process.returncode, out, said_all


def test_sigterm_stops_the_services_and_worker_repair_started(tmp_path):
    args = ["repair", str(SOFTMAX / "spec.py"), str(SOFTMAX / "variants" / "floor_grid.py")]
    status, _, said = sigterm_once_started(tmp_path, args, "repair session ")
    assert status == 128 + signal.SIGTERM, said
    assert "stopped by SIGTERM" in said


def test_sigterm_cancels_a_fleet_and_stops_the_services_it_started(tmp_path):
    # As Ctrl-C: the fleet is cancelled (what finished is kept), then the command stops its
    # worker, Temporal and PostgreSQL on its way out, instead of dying with them running.
    manifest = tmp_path / "fleet.json"
    member = {
        "spec": str(SOFTMAX / "spec.py"),
        "candidate": str(SOFTMAX / "variants" / "floor_grid.py"),
    }
    manifest.write_text(json.dumps([member]))
    status, out, said = sigterm_once_started(tmp_path, ["fleet", str(manifest), "--json"], "fleet ")
    assert status == 1, said  # the fleet did not run to its end
    assert json.loads(out)["state"] == "cancelled"


def _result(certified: bool) -> RepairResult:
    return RepairResult(
        session_id="repair-x",
        certified=certified,
        rounds=2,
        stop_reason="certified" if certified else "no_progress",
        stop_detail="",
        tokens=TokenUsage(),
        original_hash="sha256:a",
        final_hash="sha256:b",
    )


@pytest.mark.parametrize("as_json", [False, True])
def test_an_uncertified_diff_is_labelled_as_no_fix(tmp_path, as_json):
    candidate = tmp_path / "k.py"
    candidate.write_text("x = 1\n")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = _report(_result(False), candidate, "x = 1\n", "x = 2\n", None, as_json)
    assert status == 1
    assert not (tmp_path / "k.fixed.py").exists()  # nothing written
    if as_json:
        report = json.loads(out.getvalue())
        assert report["diff_certified"] is False and "+x = 2" in report["diff"]
        assert "k.fixed.py" not in report["diff"] and report["fixed_path"] is None
        assert err.getvalue().startswith("NOT CERTIFIED after 2 round(s)")
    else:
        text = out.getvalue()
        assert f"{UNCERTIFIED_HEADER}:" in text and "+x = 2" in text
        assert text.index(UNCERTIFIED_HEADER) < text.index("+x = 2")
        assert "k.fixed.py" not in text and "k.uncertified.py" in text
    # The same diff, certified, is a fix: written, and not labelled.
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert _report(_result(True), candidate, "x = 1\n", "x = 2\n", None, as_json) == 0
    assert UNCERTIFIED_HEADER not in out.getvalue() and "k.fixed.py" in out.getvalue()
    assert (tmp_path / "k.fixed.py").read_text() == "x = 2\n"


def _two_bugs(folder: Path) -> Path:
    """An axpy kernel with two bugs no recipe knows: the refs in the wrong order, and a quarter
    of y where half is meant. It fails the compact suite: a repair goes on to a fix."""
    candidate = folder / "axpy.py"
    source = (SEARCH / "axpy_swapped_refs.py").read_text()
    candidate.write_text(source.replace("- 0.5 * y_ref", "- 0.25 * y_ref"))
    return candidate


def _two_bugs_and_a_thousand_mutants(folder: Path) -> Path:
    """The two-bug axpy kernel whose body also runs a hundred steps that leave its value as it
    is (``out * 1.0 + 0.0 * x``): about a thousand single-site mutants, none of which fixes
    both bugs, so the search has far more to screen than a short deadline allows."""
    candidate = _two_bugs(folder)
    source = candidate.read_text()
    steps = "".join(f"    out = out * 1.0 + 0.0 * x  # step {i}\n" for i in range(100))
    body = (
        "def _axpy_body(y_ref, x_ref, o_ref):\n"
        "    x = x_ref[...]\n"
        "    out = x - 0.25 * y_ref[...]\n" + steps + "    o_ref[...] = out\n"
    )
    one_line = (
        "def _axpy_body(y_ref, x_ref, o_ref):\n    o_ref[...] = x_ref[...] - 0.25 * y_ref[...]\n"
    )
    assert one_line in source
    candidate.write_text(source.replace(one_line, body))
    return candidate


def test_a_fix_still_running_at_the_deadline_is_ended_there(
    temporal_address, postgres_dsn, tmp_path
):
    # The model takes five minutes to answer: Temporal ends the fix at the session's deadline,
    # and the session stops then with the deadline as its reason, not when the model answers.
    candidate = _two_bugs(tmp_path)
    deadline = 20
    with FakeOpenAI() as fake:
        fake.script(slow("no edit", delay_s=300))
        env = dict(
            os.environ,
            TEMPORAL_ADDRESS=temporal_address,
            NEARMISS_DATABASE_URL=postgres_dsn,
            OPENAI_BASE_URL=fake.base_url,
            OPENAI_API_KEY="test-key",
        )
        started = time.monotonic()
        result = run_cli(
            "repair",
            SEARCH / "axpy_spec.py",
            candidate,
            "--model",
            "openai:fake",
            "--tool-calls-per-round",
            "0",
            "--deadline",
            str(deadline),
            "--json",
            env=env,
        )
        took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["stop_reason"] == "deadline", report
    assert report["stop_detail"].endswith("(it ended round 1's fix)"), report["stop_detail"]
    elapsed = float(report["stop_detail"].split(" s elapsed")[0])
    assert deadline <= elapsed <= deadline + GRACE_S, report["stop_detail"]
    assert "Traceback" not in result.stderr, result.stderr
    assert took < deadline + 60, (took, result.stderr)  # the command's start included


def test_a_search_repair_ends_at_its_deadline(temporal_address, postgres_dsn, tmp_path):
    # No single-site mutant fixes both bugs, and there are about a thousand to screen, so the
    # search would screen for minutes. The deadline ends the session, in a search's round, and
    # says so.
    candidate = _two_bugs_and_a_thousand_mutants(tmp_path)
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    deadline = 30
    started = time.monotonic()
    result = run_cli(
        "repair",
        SEARCH / "axpy_spec.py",
        candidate,
        "--model",
        "search",
        "--deadline",
        str(deadline),
        "--json",
        env=env,
    )
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is False and report["stop_reason"] == "deadline"
    assert "'s fix)" in report["stop_detail"], report["stop_detail"]
    # --json: stdout held the JSON alone (parsed above); progress went to stderr as it came.
    lines = result.stderr.splitlines()
    assert any(line.startswith("repair session repair-axpy-") for line in lines), result.stderr
    assert any(line.strip().startswith("round 0 · fix · wrong_values") for line in lines)
    assert lines[-1].startswith("NOT CERTIFIED after "), result.stderr
    # The session's deadline counts from its start, after the command's own (JAX, the worker):
    # the grace covers those and the stop, far below the search's minutes.
    assert took < deadline + 30, (took, result.stderr)


def test_the_loop_stops_with_the_deadline_when_it_ends_a_running_step():
    loop = RepairLoop(LoopState(guards=Guards(deadline_s=30)))
    loop.begin("sha256:k", now=100.0)
    step = loop.on_deadline(131.0, "the forensics check")
    assert step.action.kind == "stop" and step.action.reason == "deadline"
    assert step.action.detail == "31 s elapsed, deadline 30 s (it ended the forensics check)"
    assert [e.type for e in step.events] == ["GuardTripped"]
    result = loop.result("repair-x")
    assert result.stop_reason == "deadline" and not result.certified


def test_the_tokens_of_a_fix_the_deadline_cut_short_count_in_the_session():
    # An agent round's model turns had answered before the deadline ended the round: the
    # session's total (its budget, its result) includes what they took.
    loop = RepairLoop(LoopState(guards=Guards(deadline_s=30)))
    loop.begin("sha256:k", now=100.0)
    spent = TokenUsage(input=120, output=30)
    step = loop.on_deadline(131.0, "round 1's fix", spent=spent)
    assert step.action.kind == "stop" and step.action.reason == "deadline"
    assert loop.result("repair-x").tokens == spent


def test_a_progress_line_says_the_round_the_fix_and_the_verdict_so_far():
    progress = Progress(
        phase="validate",
        round=2,
        last_fix="grid_round_up",
        failure_class="wrong_values",
        score=0.5,
        tokens=TokenUsage(input=30, output=12),
    )
    line = progress_line(progress)
    assert line == "round 2 · validate · fix grid_round_up · wrong_values · score 0.50 · tokens 42"
    assert " · fix " not in progress_line(Progress())  # no round yet, no fix to name
