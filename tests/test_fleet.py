"""Fleets: many playbook repairs as child workflows of one FleetWorkflow — real Temporal, real
PostgreSQL, real checks. Continue-as-new, cancellation, a worker killed mid-fleet, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError
from test_worker_crash import start_worker, stop_workers, wait_for_event

from conftest import OPS, ROOT, run_cli
from nearmiss.client.fleet import (
    MemberFile,
    describe_specs,
    discover,
    fleet_summary,
    list_fleets,
    start_fleet,
)
from nearmiss.client.service import build_worker
from nearmiss.engine.errors import UsageError
from workflows.fleet import FleetWorkflow
from workflows.loop import Guards

# Playbook sessions, each certified in one round or stopped with no recipe.
MATMUL = MemberFile(
    "matmul/missing_init", OPS / "matmul" / "spec.py", OPS / "matmul/variants/missing_init.py"
)
GELU = MemberFile(
    "gelu_tanh/wrong_constant",
    OPS / "gelu_tanh" / "spec.py",
    OPS / "gelu_tanh/variants/wrong_constant.py",
)
LAYER_NORM = MemberFile(
    "layer_norm/f32_output",
    OPS / "layer_norm" / "spec.py",
    OPS / "layer_norm/variants/f32_output.py",
)
# The fleets that run to the end repair cheap kernels (fleets are about their members' sessions
# as a whole, not the kernels): the tiny kernel of tests/tiny/double_rows, and an elementwise one.
TINY = MemberFile(
    "double_rows/floor_grid",
    ROOT / "tests/tiny/double_rows/spec.py",
    ROOT / "tests/tiny/double_rows/variants/floor_grid.py",
)
LEAKY_RELU = MemberFile(
    "leaky_relu/python_if", OPS / "leaky_relu" / "spec.py", OPS / "leaky_relu/variants/python_if.py"
)


def test_a_directory_yields_every_near_miss_below_each_spec():
    members = discover(OPS / "matmul")
    names = {m.name for m in members}
    variants = {f"matmul/{p.stem}" for p in (OPS / "matmul" / "variants").glob("*.py")}
    assert names == variants and all(m.spec == OPS / "matmul" / "spec.py" for m in members)
    everything = discover(OPS)
    assert len(everything) > len(members) and "softmax_rows/floor_grid" in {
        m.name for m in everything
    }
    assert not any(m.candidate.name == "golden.py" for m in everything)


def test_a_manifest_resolves_paths_relative_to_itself_and_bad_ones_are_named(tmp_path):
    manifest = tmp_path / "fleet.json"
    entry = {"spec": str(MATMUL.spec), "candidate": str(MATMUL.candidate), "name": "mm"}
    manifest.write_text(json.dumps([entry]))
    assert discover(manifest) == [MemberFile("mm", MATMUL.spec, MATMUL.candidate)]
    manifest.write_text(json.dumps({"members": [{"spec": "nowhere.py", "candidate": "x.py"}]}))
    with pytest.raises(UsageError, match="entry 1: spec file not found"):
        discover(manifest)
    manifest.write_text("[{]")
    with pytest.raises(UsageError, match="not a JSON manifest"):
        discover(manifest)
    with pytest.raises(UsageError, match="not found"):
        discover(tmp_path / "missing")


GOOD_ENTRY = {"spec": str(MATMUL.spec), "candidate": str(MATMUL.candidate)}


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"spec": 3}, "entry 2: spec must be a file path (a string), not 3"),
        ({"candidate": ["a"]}, 'entry 2: candidate must be a file path (a string), not ["a"]'),
        ({"spec": None}, "entry 2: spec must be a file path (a string), not null"),
        ({"spec": "a\u0000b"}, "entry 2: spec must be a file path (a string), not 'a\\x00b'"),
        ({"spec": " "}, "entry 2: spec must be a file path (a string), not ' '"),
        ({"name": 7}, "entry 2: name must be a non-empty string, not 7"),
        ({"targets": 5}, 'entry 2: targets must be "a,b" or a list of names, not 5'),
        (
            {"targets": "tpu-v9"},
            "entry 2: unknown target `tpu-v9`: choose from interpret, tpu-v4, tpu-v5e, tpu-v5p, "
            "tpu-v6e, gpu",
        ),
        ("matmul/spec.py", 'entry 2 needs "spec" and "candidate"'),
    ],
)
def test_a_malformed_manifest_entry_is_named_not_a_traceback(tmp_path, entry, message):
    if isinstance(entry, dict):
        entry = {**GOOD_ENTRY, **entry}
    manifest = tmp_path / "fleet.json"
    manifest.write_text(json.dumps([GOOD_ENTRY, entry]))
    with pytest.raises(UsageError, match=re.escape(message)):
        discover(manifest)


def test_the_fleet_command_names_a_malformed_entry_in_one_line(tmp_path):
    """The command reads a manifest with ``discover`` and says its UsageError as it is, whichever
    entry is malformed (the test above pins each message): one entry stands for them all, the
    one whose value would break the line if it were printed raw."""
    manifest = tmp_path / "fleet.json"
    manifest.write_text(json.dumps([GOOD_ENTRY, {**GOOD_ENTRY, "spec": "a\u0000b"}]))
    message = "entry 2: spec must be a file path (a string), not 'a\\x00b'"
    ran = run_cli("fleet", manifest, env=dict(os.environ, NEARMISS_HOME=str(tmp_path / "home")))
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.strip().splitlines() == [f"nearmiss: error: {manifest}: {message}"]


async def test_a_fleets_specs_are_described_together_and_a_broken_one_is_named(tmp_path):
    specs = [MATMUL.spec, GELU.spec, LAYER_NORM.spec]
    described = await describe_specs(specs)
    assert {path: d["name"] for path, d in described.items()} == {
        MATMUL.spec: "matmul",
        GELU.spec: "gelu_tanh",
        LAYER_NORM.spec: "layer_norm",
    }
    broken = tmp_path / "spec.py"
    broken.write_text("raise RuntimeError('no spec here')\n")
    with pytest.raises(UsageError, match="no spec here"):
        await describe_specs([*specs, broken])


async def test_a_fleet_runs_every_member_under_its_limit_and_continues_as_new(client, seeded_store):
    store = seeded_store
    async with build_worker(client, store, fail_workflows_on_error=True):
        handle = await start_fleet(
            client,
            store,
            [TINY, GELU, LEAKY_RELU],
            model="playbook",
            guards=Guards(),
            concurrency=2,
            members_per_run=2,  # three members: the third starts in a second run
        )
        most_running = 0
        task = asyncio.ensure_future(handle.result())
        while not task.done():
            progress = await handle.query(FleetWorkflow.progress)
            most_running = max(most_running, len(progress.running))
            await asyncio.wait({task}, timeout=0.3)
        result = task.result()
        final = await handle.query(FleetWorkflow.progress)
    assert most_running == 2
    assert final.runs == 2 and final.finished == 3
    verdicts = {r.name: r.verdict for r in result.results}
    assert verdicts == {
        "double_rows/floor_grid": "certified",
        "gelu_tanh/wrong_constant": "no_fix",
        "leaky_relu/python_if": "certified",
    }
    assert result.certified == 2 and result.tokens.total == 0
    events = await store.read_stream(handle.id)
    types = [e.type for e in events]
    assert types == ["FleetStarted"] + ["FleetMemberFinished"] * 3 + ["FleetFinished"]
    assert [e.version for e in events] == [1, 2, 3, 4, 5]  # one stream across both runs
    for member in result.results:  # every member's session is a full repair stream
        session = await store.read_stream(member.session_id)
        assert session[-1].type == "RepairFinished"
        assert session[-1].payload["certified"] == member.certified
    summary = await fleet_summary(store, handle.id)
    assert summary["state"] == "finished" and summary["certified"] == 2
    assert [f["fleet_id"] for f in await list_fleets(store)] == [handle.id]


async def test_cancelling_a_fleet_cancels_its_sessions_and_records_it(client, seeded_store):
    store = seeded_store
    async with build_worker(client, store, fail_workflows_on_error=True):
        handle = await start_fleet(
            client, store, [TINY, LEAKY_RELU], model="playbook", guards=Guards(), concurrency=1
        )
        first = f"{handle.id}.00000-double_rows"
        await wait_for_event(store, first, "EvidenceCollected", timeout_s=120)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert isinstance(failure.value.cause, CancelledError), failure.value.cause
        await wait_for_event(store, handle.id, "FleetFinished", timeout_s=30)
    summary = await fleet_summary(store, handle.id)
    assert summary["state"] == "cancelled"
    assert [r["verdict"] for r in summary["results"]] == ["cancelled"]  # the second never ran
    child = await client.get_workflow_handle(first).describe()
    assert child.status.name == "CANCELED"


async def test_a_worker_killed_mid_fleet_is_replaced_and_every_member_ends_once(
    client, seeded_store, temporal_address, postgres_dsn, tmp_path
):
    store = seeded_store
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    with open(tmp_path / "workers.log", "wb") as log:
        first, second = start_worker(env, log), None
        try:
            handle = await start_fleet(
                client,
                store,
                [TINY, GELU, LEAKY_RELU],
                model="playbook",
                guards=Guards(),
                concurrency=2,
            )
            await wait_for_event(store, handle.id, "FleetMemberFinished", timeout_s=180)
            os.killpg(first.pid, signal.SIGKILL)  # the other sessions are mid-check
            first.wait()
            second = start_worker(env, log)
            result = await asyncio.wait_for(handle.result(), timeout=300)
        finally:
            stop_workers(first, second)
    assert sorted(r.index for r in result.results) == [0, 1, 2], tmp_path / "workers.log"
    assert result.certified == 2
    events = await store.read_stream(handle.id)
    finished = [e.payload["index"] for e in events if e.type == "FleetMemberFinished"]
    assert sorted(finished) == [0, 1, 2]  # each member recorded exactly once
    assert [e.version for e in events] == list(range(1, len(events) + 1))


def test_the_fleet_command_runs_a_manifest_and_lists_it_later(
    temporal_address, postgres_dsn, tmp_path
):
    # Two members on one spec, each with its own target: a fleet can mix them.
    manifest = tmp_path / "fleet.json"
    one_row = TINY.spec.parent / "variants" / "tpu_one_row_block.py"
    manifest.write_text(
        json.dumps(
            [
                {"spec": str(TINY.spec), "candidate": str(TINY.candidate)},
                {"spec": str(TINY.spec), "candidate": str(one_row), "targets": ["tpu-v5e"]},
            ]
        )
    )
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    ran = run_cli("fleet", manifest, "--json", "--report", tmp_path / "report", env=env)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["state"] == "finished" and summary["certified"] == 2
    first, second = summary["results"]
    assert first["name"] == "double_rows/floor_grid" and first["targets"] == {"interpret": True}
    # Certified for the chip: the playbook fixed the tiling the TPU compiler refused.
    assert second["name"] == "double_rows/tpu_one_row_block" and second["rounds"] >= 1
    assert second["targets"] == {"tpu-v5e": True}
    report = tmp_path / "report" / "index.html"
    assert summary["report"] == str(report) and "floor_grid" in report.read_text()
    listed = run_cli("fleets", "--json", env=env)
    assert [f["fleet_id"] for f in json.loads(listed.stdout)] == [summary["fleet_id"]]
    shown = run_cli("fleets", summary["fleet_id"], env=env)
    assert shown.returncode == 0 and "certified" in shown.stdout
    assert "tpu-v5e:ok" in shown.stdout and "interpret:ok" in shown.stdout
    missing = run_cli("fleets", "fleet-nope", env=env)
    assert missing.returncode == 2 and "no fleet fleet-nope" in missing.stderr


async def test_a_member_a_learned_patch_breaks_is_reverted_and_still_certifies(
    client, seeded_store, tmp_path
):
    """Learning mid-fleet never makes a member that certifies on its own end uncertified. The
    tiny kernel's floor grid teaches a patch (``pl.cdiv``) whose changed line also stands in
    ``softmax_two_bugs.py``, which imports pallas under its own name: run after the teacher, the
    patch breaks its build, is reverted and recorded against that kernel, and the playbook then
    repairs both its bugs: both members certify, as each does on its own. The other order tries
    the same revert the other way round (a patch learned from the pupil on the teacher), so one
    order stands for both; ``benchmarks/fleet_order.py`` runs a whole fleet in both orders, each
    on a fresh stack."""
    store = seeded_store
    teacher = TINY
    spec = OPS / "softmax_rows" / "spec.py"
    pupil_path = tmp_path / "softmax_two_bugs.py"  # a kernel no earlier run recorded anything on
    pupil_path.write_text(
        (ROOT / "tests" / "transfer" / "softmax_two_bugs.py").read_text()
        + f"# {uuid.uuid4().hex}\n"
    )
    pupil = MemberFile("softmax_two_bugs", spec, pupil_path)
    async with build_worker(client, store, fail_workflows_on_error=True):
        handle = await start_fleet(
            client, store, [teacher, pupil], model="playbook", guards=Guards(), concurrency=1
        )
        result = await handle.result()
    session = await store.read_stream(
        next(r.session_id for r in result.results if r.name == pupil.name)
    )
    fixes = [e.payload for e in session if e.type == "FixProposed"]
    judged = [e.payload for e in session if e.type == "CandidateValidated"]
    assert fixes[0]["model"] == "learned-patch", fixes
    assert judged[0]["outcome"] == "regression_reverted", judged
    assert {r.name for r in result.results if r.certified} == {teacher.name, pupil.name}
