"""Fleets ride out their own infrastructure. A playbook fleet run by the `nearmiss fleet` command
has PostgreSQL killed (immediate stop, as a crash) and restarted mid-fleet, then Temporal killed
(SIGKILL) and restarted on the same SQLite file: every member ends once, as it does undisturbed,
and the command reconnects. A command that cannot get Temporal back says how to follow the fleet.
Workers that start remove the scratch directories of dead ones, and stop what those left running.
Real Temporal, real PostgreSQL, real checks, `nearmiss` processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_worker_crash import start_worker, stop_workers

from conftest import OPS, ROOT, private_stack
from infra.devstack import PostgresService, TemporalService, wait_exit
from kb.events import EventStore
from nearmiss.client.faults import is_infrastructure_error
from nearmiss.engine.runner import scratch
from nearmiss.engine.runner.environment import find_sandbox
from nearmiss.engine.runner.protocol import CHANNEL_ENV
from nearmiss.engine.runner.scratch import scratch_dir, stop_orphaned_children, sweep_orphans

# Quick playbook sessions, and how each ends undisturbed (tests/test_fleet.py pins them): two
# that certify, each fixed after its first check (in flight together when PostgreSQL goes), and
# one that stops with no recipe, started once one of them has ended (the fleet still runs when
# Temporal goes).
TINY = ROOT / "tests" / "tiny"
MEMBERS = {
    "double_rows/floor_grid": (TINY / "double_rows", "floor_grid", "certified"),
    "leaky_relu/python_if": (OPS / "leaky_relu", "python_if", "certified"),
    "gelu_tanh/wrong_constant": (OPS / "gelu_tanh", "wrong_constant", "no_fix"),
}
POSTGRES_OUTAGE_S = 18.0
# Longer than the Temporal client's own RPC retries (temporalio's RetryConfig: up to 10 retries
# over about 10 s), which ride out a shorter outage without the command ever seeing it: 8 s plus
# the server's restart was on that edge, and a loaded CI machine fell on the silent side.
TEMPORAL_OUTAGE_S = 16.0


def _manifest(path: Path, names: list[str]) -> Path:
    entries = []
    for name in names:
        folder, variant, _ = MEMBERS[name]
        spec, candidate = folder / "spec.py", folder / "variants" / f"{variant}.py"
        entries.append({"spec": str(spec), "candidate": str(candidate), "name": name})
    path.write_text(json.dumps(entries))
    return path


def _fleet_command(manifest: Path, env: dict, out: Path, *extra: str) -> subprocess.Popen:
    """`nearmiss fleet MANIFEST`, its output in ``out``/stdout and ``out``/stderr."""
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "nearmiss.cli", "fleet", str(manifest), *extra],
            env=env,
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )


def _end(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _kill_temporal(temporal: TemporalService) -> None:
    pid = temporal.pid()
    os.kill(pid, signal.SIGKILL)
    assert wait_exit(pid, 10.0)


async def _events(store: EventStore, stream: str) -> list:
    """A stream's events, waiting out a database that is coming back."""
    for _ in range(100):
        try:
            return await store.read_stream(stream)
        except Exception as exc:
            if not is_infrastructure_error(exc):
                raise
            await asyncio.sleep(0.5)
    raise AssertionError(f"the database never came back for {stream}")


async def _fleet_id(store: EventStore, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = await store.recent_of_type("FleetStarted", 1)
        if started:
            return started[0].stream_id
        await asyncio.sleep(0.2)
    raise AssertionError("the fleet never started")


async def _wait_until(store: EventStore, streams, kind: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for stream in streams:
            if any(e.type == kind for e in await _events(store, stream)):
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {kind} within {timeout_s} s")


def _assert_once_each(events: list) -> None:
    keys = [json.dumps([e.type, e.payload], sort_keys=True) for e in events]
    assert len(keys) == len(set(keys)), "an event was recorded twice"
    assert [e.version for e in events] == list(range(1, len(events) + 1))


@pytest.fixture
def stack(tmp_path):
    """Temporal and PostgreSQL of this test alone: it kills them."""
    config = private_stack(tmp_path / "state")
    temporal, postgres = TemporalService(config), PostgresService(config)
    temporal.start()
    postgres.start()
    try:
        yield config, temporal, postgres
    finally:
        temporal.stop()
        postgres.stop()
        postgres.remove_data()


async def test_a_fleet_rides_out_a_postgres_and_a_temporal_restart(stack, tmp_path):
    config, temporal, postgres = stack
    names = list(MEMBERS)
    env = dict(
        os.environ,
        TEMPORAL_ADDRESS=config.temporal_address,
        NEARMISS_DATABASE_URL=config.connect_dsn,
        NEARMISS_RECONNECT_S="180",
    )
    manifest = _manifest(tmp_path / "fleet.json", names)
    store = await EventStore.connect(config.connect_dsn)
    command = _fleet_command(
        manifest, env, tmp_path, "--json", "--concurrency", "2", "--report", str(tmp_path / "r")
    )
    try:
        fleet_id = await _fleet_id(store, timeout_s=120)
        sessions = [f"{fleet_id}.{i:05d}-{MEMBERS[n][0].name}" for i, n in enumerate(names)]
        await _wait_until(store, sessions[:2], "EvidenceCollected", timeout_s=180)
        postgres.stop(mode="immediate")  # a crash: sessions are mid-check, recording, fixing
        await asyncio.sleep(POSTGRES_OUTAGE_S)
        postgres.start()
        await _wait_until(store, [fleet_id], "FleetMemberFinished", timeout_s=180)
        fleet_events = await _events(store, fleet_id)
        assert "FleetFinished" not in [e.type for e in fleet_events], "nothing left to disturb"
        _kill_temporal(temporal)
        await asyncio.sleep(TEMPORAL_OUTAGE_S)
        temporal.start()  # on the same SQLite file
        returncode = await asyncio.to_thread(command.wait, 300)
    finally:
        _end(command)
        stderr = (tmp_path / "stderr").read_text()
    try:
        assert returncode == 0, stderr
        assert "Traceback" not in stderr, stderr
        assert "Temporal tries it again" in stderr  # the outage was felt, and waited out
        assert "lost Temporal at" in stderr and "Temporal is back" in stderr, stderr
        summary = json.loads((tmp_path / "stdout").read_text())
        assert summary["fleet_id"] == fleet_id and summary["state"] == "finished"
        verdicts = {r["name"]: r["verdict"] for r in summary["results"]}
        assert verdicts == {name: MEMBERS[name][2] for name in names}, summary["results"]
        fleet_events = await _events(store, fleet_id)
        _assert_once_each(fleet_events)
        finished = [e.payload["index"] for e in fleet_events if e.type == "FleetMemberFinished"]
        assert sorted(finished) == list(range(len(names)))  # each member ended exactly once
        assert [e.type for e in fleet_events][-1] == "FleetFinished"
        for session, name in zip(sessions, names, strict=True):  # no session lost
            events = await _events(store, session)
            _assert_once_each(events)
            types = [e.type for e in events]
            assert types.count("RepairStarted") == 1 and types.count("RepairFinished") == 1
            assert types[-1] == "RepairFinished", (session, types)
            assert events[-1].payload["certified"] == (MEMBERS[name][2] == "certified")
    finally:
        await store.close()


async def test_the_fleet_command_says_how_to_follow_when_temporal_stays_away(
    postgres_dsn, tmp_path
):
    config = private_stack(tmp_path / "state")
    temporal = TemporalService(config)
    temporal.start()
    env = dict(
        os.environ,
        TEMPORAL_ADDRESS=config.temporal_address,
        NEARMISS_DATABASE_URL=postgres_dsn,
        NEARMISS_RECONNECT_S="5",
    )
    store = await EventStore.connect(postgres_dsn)
    command = _fleet_command(
        _manifest(tmp_path / "fleet.json", ["double_rows/floor_grid"]), env, tmp_path
    )
    try:
        fleet_id = await _fleet_id(store, timeout_s=120)
        _kill_temporal(temporal)
        returncode = await asyncio.to_thread(command.wait, 120)
        following = subprocess.run(
            [sys.executable, "-m", "nearmiss.cli", "fleets", fleet_id, "--follow"],
            env=dict(env, NEARMISS_RECONNECT_S="2"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        _end(command)
        temporal.stop()
        await store.close()
    stderr = (tmp_path / "stderr").read_text()
    assert returncode == 3, stderr
    assert "Traceback" not in stderr, stderr
    follow_hint = f"`nearmiss fleets {fleet_id} --follow`"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("nearmiss: lost Temporal at") and follow_hint in last, stderr
    # Following it while Temporal is still away: the same one line, no traceback.
    assert following.returncode == 3, following.stderr
    assert "Traceback" not in following.stderr
    assert follow_hint in following.stderr.strip().splitlines()[-1], following.stderr


# --- scratch directories of dead workers --------------------------------------------------------


def _scratch_of_a_killed_process(prefix: str, env: dict | None = None) -> Path:
    """A scratch directory whose owner was killed with SIGKILL before it could remove it."""
    code = (
        "import sys, time\n"
        "from nearmiss.engine.runner.scratch import scratch_dir\n"
        f"d = scratch_dir({prefix!r}); (d / 'spec.py').write_text('x')\n"
        "print(d, flush=True); time.sleep(120)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        folder = Path(child.stdout.readline().strip())
    finally:
        child.kill()
        child.wait()
    assert folder.is_dir()
    return folder


def test_the_sweep_removes_the_scratch_of_dead_processes_only(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    dead = [
        _scratch_of_a_killed_process(p, env) for p in ("nearmiss-candidate-", "nearmiss-check-")
    ]
    mine = scratch_dir("nearmiss-reference-")  # this process is alive: kept
    assert mine.parent == tmp_path and mine.name.startswith("nearmiss-reference-p")
    tag = mine.name[len("nearmiss-reference-") :].split("-", 1)[0]
    pid, rest = tag[1:].split("s", 1)
    start, boot = rest.split("b", 1)
    reused_pid = tmp_path / f"nearmiss-check-p{pid}s{int(start) + 1}b{boot}-aaaa"  # not its start
    other_boot = tmp_path / f"nearmiss-check-p{pid}s{start}b{'f' * 8}-bbbb"  # before a reboot
    old, young = tmp_path / "nearmiss-candidate-k3j2h1ab", tmp_path / "nearmiss-check-zz9y8x7w"
    for folder in (reused_pid, other_boot, old, young):
        folder.mkdir()
    os.utime(old, (time.time() - 2 * 86400,) * 2)  # ownerless and two days old
    unrelated = [tmp_path / "nearmiss-postgres-1234", tmp_path / "pytest-of-someone"]
    for folder in unrelated:
        folder.mkdir()
    plain_file = tmp_path / "nearmiss-check-p1s1b0-file"
    plain_file.write_text("not a directory")

    assert sweep_orphans() == 5
    assert not any(p.exists() for p in (*dead, reused_pid, other_boot, old))
    assert mine.is_dir() and young.is_dir() and plain_file.is_file()
    assert all(p.is_dir() for p in unrelated)
    assert sweep_orphans() == 0
    shutil.rmtree(mine)


def _sandbox_in(folder: Path) -> subprocess.Popen:
    """A real bwrap naming ``folder`` as a sandbox's home does, waiting: what an engine's child
    looks like from outside (the shape a killed worker's half-started sandbox was left in)."""
    sandbox = find_sandbox()
    assert not isinstance(sandbox, str), sandbox
    command = [sandbox.executable, "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/"]
    command += ["--bind", str(folder), str(folder)]
    return subprocess.Popen([*command, "--chdir", str(folder), "sleep", "300"], cwd=folder)


def _gone(process: subprocess.Popen, timeout_s: float = 10) -> bool:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_the_sweep_stops_the_children_of_dead_processes_only(tmp_path):
    dead, alive = _scratch_of_a_killed_process("nearmiss-candidate-"), scratch_dir("nearmiss-x-")
    to_child, from_child = os.pipe(), os.pipe()  # ends held here: the child waits for a message
    env = dict(os.environ, **{CHANNEL_ENV: f"{to_child[0]},{from_child[1]}"})
    doomed = [
        _sandbox_in(dead),
        subprocess.Popen(  # an unsandboxed child (--unsafe-no-sandbox) working there
            [sys.executable, "-m", "nearmiss.engine.runner.executor_child"],
            cwd=dead, env=env, pass_fds=(to_child[0], from_child[1]),
        ),
    ]  # fmt: skip
    spared = [
        _sandbox_in(alive),  # its owner, this process, is alive
        subprocess.Popen(["sleep", "300"], cwd=dead),  # works there, but is no engine's child
    ]
    try:
        time.sleep(1)  # bwrap has set up and the child is waiting, both named as they will be
        assert all(p.poll() is None for p in doomed + spared)
        assert stop_orphaned_children() >= len(doomed)
        assert all(_gone(p) for p in doomed)
        assert all(p.poll() is None for p in spared)
        assert stop_orphaned_children() == 0
    finally:
        for process in doomed + spared:
            process.kill()
            process.wait()
        for fd in (*to_child, *from_child):
            os.close(fd)
        shutil.rmtree(dead, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)


def test_a_starting_worker_removes_the_scratch_of_dead_workers(
    temporal_address, postgres_dsn, tmp_path
):
    """...and stops what they left running there."""
    orphans = [_scratch_of_a_killed_process(f"nearmiss-{k}-") for k in ("check", "candidate")]
    left_running = _sandbox_in(orphans[1])
    alive = scratch_dir("nearmiss-check-")
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    worker = None
    try:
        with open(tmp_path / "worker.log", "wb") as log:
            worker = start_worker(env, log)
            deadline = time.monotonic() + 60
            while any(p.exists() for p in orphans) and time.monotonic() < deadline:
                time.sleep(0.2)
        assert not any(p.exists() for p in orphans), (tmp_path / "worker.log").read_text()
        assert _gone(left_running), (tmp_path / "worker.log").read_text()
        assert alive.is_dir()  # a live process's scratch is left alone
    finally:
        left_running.kill()
        left_running.wait()
        stop_workers(worker)
        shutil.rmtree(alive, ignore_errors=True)
        for orphan in orphans:
            shutil.rmtree(orphan, ignore_errors=True)
