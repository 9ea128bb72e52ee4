"""Checks run on workers that serve their target: one Temporal task queue per target.

A fleet with an interpret member and a tpu-v5e member, served by an in-process worker (general
queue + interpret checks) and a `nearmiss worker --targets tpu-v5e --checks-only` process: every
check is recorded on a worker of its own target; that process is killed mid-fleet, and the fleet
finishes once a new one serves the target. A session whose target no worker serves stops with
``no_worker``, naming the target, instead of waiting forever. Real Temporal, PostgreSQL, checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid

import pytest
from temporalio.exceptions import ApplicationError
from test_worker_crash import start_worker, stop_workers

from activities.placement import Placement
from conftest import OPS, run_cli
from nearmiss.client.fleet import MemberFile, start_fleet
from nearmiss.client.service import build_worker, served_targets, start_session
from nearmiss.client.workers import list_workers
from nearmiss.engine.errors import UsageError
from workflows.loop import Guards
from workflows.routing import check_queue, routing_target

MATMUL = OPS / "matmul"


def test_a_check_goes_to_the_queue_of_its_most_demanding_target():
    assert routing_target([]) == "interpret"
    assert routing_target(["interpret", "tpu-v5e", "tpu-v6e"]) == "tpu-v5e"
    assert routing_target(["tpu-v6e", "gpu"]) == "gpu"
    assert check_queue(["interpret"]) == "nearmiss-check-interpret"


def test_a_worker_refuses_a_check_with_a_target_it_does_not_serve():
    placement = Placement("7@host", ("interpret", "tpu-v5e"), "cpu")
    placement.admit(["tpu-v5e", "interpret"])
    with pytest.raises(ApplicationError) as refused:
        placement.admit(["tpu-v5e", "tpu-v6e"])
    assert refused.value.type == "TargetNotServed" and refused.value.non_retryable
    assert "serves interpret, tpu-v5e, not tpu-v6e" in str(refused.value)


def test_a_worker_serves_what_it_is_asked_only_where_it_can():
    assert served_targets("interpret,tpu-v5e") == ("interpret", "tpu-v5e")
    with pytest.raises(UsageError, match="unknown target `tpu-v9`"):
        served_targets("tpu-v9")
    assert "interpret" in served_targets(None)


async def test_a_session_whose_target_no_worker_serves_stops_with_no_worker(
    client, seeded_store, temporal_address, postgres_dsn
):
    store = seeded_store
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    # Its own identity: the per-process client's is shared with earlier tests' workers, which
    # served tpu-v5e and which Temporal lists for minutes after they stop.
    me = f"no-tpu-{uuid.uuid4().hex[:8]}"
    async with build_worker(
        client, store, targets=("interpret",), fail_workflows_on_error=True, identity=me
    ):
        # `nearmiss workers` shows who serves what: this worker not the TPU queue.
        for _ in range(100):  # until the workers' first polls have reached the server
            polling = {(r["queue"], r["worker"]) for r in await list_workers(client)}
            if {("nearmiss-repair", me), ("nearmiss-check-interpret", me)} <= polling:
                break
            await asyncio.sleep(0.1)
        listed = run_cli("workers", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        rows = {(r["queue"], r["worker"]) for r in json.loads(listed.stdout)}
        assert ("nearmiss-repair", me) in rows
        assert ("nearmiss-check-interpret", me) in rows
        assert not any(w == me for q, w in rows if q == "nearmiss-check-tpu-v5e")
        assert ("nearmiss-check-gpu", None) in rows
        shown = run_cli("workers", env=env)
        gpu_row = next(line for line in shown.stdout.splitlines() if "nearmiss-check-gpu" in line)
        assert gpu_row.split()[1:3] == ["gpu", "none"], shown.stdout
        handle = await start_session(
            client,
            store,
            MATMUL / "spec.py",
            MATMUL / "variants" / "tpu_misaligned_block.py",
            "playbook",
            Guards(worker_wait_s=2.0),
            targets=["tpu-v5e"],
        )
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.stop_reason == "no_worker" and not result.certified
    assert "no worker serves target tpu-v5e" in result.stop_detail
    assert "nearmiss-check-tpu-v5e" in result.stop_detail
    events = [e.type for e in await store.read_stream(handle.id)]
    assert "EvidenceCollected" not in events and events[-1] == "RepairFinished"


TPU_WORKER = ("--targets", "tpu-v5e", "--checks-only")


async def test_a_fleet_of_two_targets_runs_each_check_on_a_worker_of_its_target(
    client, seeded_store, temporal_address, postgres_dsn, tmp_path
):
    store = seeded_store
    members = [
        MemberFile("matmul/missing_init", MATMUL / "spec.py", MATMUL / "variants/missing_init.py"),
        MemberFile(
            "matmul/tpu_misaligned_block",
            MATMUL / "spec.py",
            MATMUL / "variants/tpu_misaligned_block.py",
            targets=("tpu-v5e",),
        ),
    ]
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    here = ("interpret",)
    first = second = None
    with open(tmp_path / "workers.log", "wb") as log:
        try:
            first = start_worker(env, log, *TPU_WORKER)
            async with build_worker(client, store, targets=here, fail_workflows_on_error=True):
                handle = await start_fleet(
                    client, store, members, model="playbook", guards=Guards(), concurrency=2
                )
                # Killed once it has run the TPU member's first check: the next waits in the
                # target's queue until a worker serves it again.
                await _first_check_on(store, "nearmiss-check-tpu-v5e", timeout_s=180)
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
                await asyncio.sleep(2.0)
                second = start_worker(env, log, *TPU_WORKER)
                result = await asyncio.wait_for(handle.result(), timeout=300)
        finally:
            stop_workers(first, second)
    workers_log = (tmp_path / "workers.log").read_text()
    assert result.certified == 2, workers_log
    where = {}
    for member in result.results:
        events = await store.read_stream(member.session_id)
        where[member.name] = [e.payload["worker"] for e in events if e.type == "EvidenceCollected"]
    interpret = where["matmul/missing_init"]
    assert interpret and all(w["queue"] == "nearmiss-check-interpret" for w in interpret)
    assert {w["identity"] for w in interpret} == {client.identity}
    tpu = where["matmul/tpu_misaligned_block"]
    assert all(w["queue"] == "nearmiss-check-tpu-v5e" and w["targets"] == "tpu-v5e" for w in tpu)
    assert all("libtpu" in w["device"] for w in tpu)
    pids = [w["identity"].split("@")[0] for w in tpu]
    # The first check on the killed worker, the ones after on its replacement.
    assert pids[0] == str(first.pid) and set(pids[1:]) == {str(second.pid)}, workers_log
    assert len(pids) >= 2


async def _first_check_on(store, queue: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        checks = await store.recent_of_type("EvidenceCollected", 20)
        if any(e.payload.get("worker", {}).get("queue") == queue for e in checks):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no check ran on {queue} within {timeout_s} s")
