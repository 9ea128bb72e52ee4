"""Saved histories still replay against today's workflow code (determinism check).

Every workflow a worker runs has saved histories here: repairs, a fleet's two runs (the first
ends in continue-as-new) and a regenerate session; ``*before_*`` ones were recorded by older
workflow code and replay through its patches. Regenerate them with
`.venv/bin/python tests/make_histories.py NAME` only after an intended change; a history that
stops replaying means running sessions would break on upgrade.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from nearmiss.client.service import WORKFLOWS
from workflows.fleet import FleetWorkflow
from workflows.regenerate import RegenerateWorkflow
from workflows.repair import RepairWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def workflow_type(path: Path) -> str:
    started = json.loads(path.read_text())["events"][0]
    return started["workflowExecutionStartedEventAttributes"]["workflowType"]["name"]


def load(path: Path) -> WorkflowHistory:
    """The history under the workflow id it ran with (a fleet names its children after it):
    the file's name up to its first dot (``fleet.run1.json``: ``fleet``)."""
    return WorkflowHistory.from_json(path.name.split(".")[0], path.read_text())


def test_every_workflow_a_worker_runs_has_saved_histories():
    saved = {workflow_type(p) for p in HISTORIES}
    assert saved == {w.__name__ for w in WORKFLOWS}
    assert sum(workflow_type(p) == "RepairWorkflow" for p in HISTORIES) >= 3
    # Both runs of the fleet: the first one's end is its continue-as-new.
    assert '"EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW"' in (
        Path(__file__).parent / "histories" / "fleet.run1.json"
    ).read_text().replace(" ", "")


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.name.removesuffix(".json"))
async def test_a_saved_history_replays(path):
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(load(path))
    assert result.replay_failure is None


def _record_one_first(original, first_version: int):
    """A ``_record`` that records its first event alone before the rest, at the first record."""

    async def record(self, *args):
        version = self.request.version if isinstance(self, FleetWorkflow) else self.version
        if version == first_version:
            if isinstance(self, FleetWorkflow):
                await original(self, *args)  # one event per call: record it twice
            elif args[0]:
                await original(self, args[0][:1])
        await original(self, *args)

    return record


@pytest.mark.parametrize(
    "workflow, history",
    [
        (RepairWorkflow, "certified_after_two_rounds"),
        (RepairWorkflow, "certified_after_two_rounds_before_local"),
        (RepairWorkflow, "certified_after_two_rounds_before_start"),
        (FleetWorkflow, "fleet.run1"),
        (RegenerateWorkflow, "regenerate_two_trials"),
    ],
)
async def test_a_changed_command_sequence_is_caught(monkeypatch, workflow, history):
    # Control: replay must be able to fail. Recording one extra event first changes the
    # workflow's commands, which the replayer has to reject.
    monkeypatch.setattr(workflow, "_record", _record_one_first(workflow._record, 0))
    path = Path(__file__).parent / "histories" / f"{history}.json"
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),  # the sandbox would re-import the original
    )
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "Nondeterminism" in str(result.replay_failure), result.replay_failure


def activities_of(history: str) -> tuple[list[str], list[str], int]:
    """(activities the server scheduled, local activities, workflow tasks) of a saved history."""
    events = json.loads((Path(__file__).parent / "histories" / f"{history}.json").read_text())
    scheduled, local, tasks = [], [], 0
    for event in events["events"]:
        if "activityTaskScheduledEventAttributes" in event:
            scheduled.append(event["activityTaskScheduledEventAttributes"]["activityType"]["name"])
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker["markerName"] == "core_local_activity":
            data = json.loads(base64.b64decode(marker["details"]["data"]["payloads"][0]["data"]))
            local.append(data["activity_type"])
        tasks += event["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED"
    return scheduled, local, tasks


def test_a_repair_waits_on_the_server_only_for_its_checks_and_fixes():
    # Recording, retrieval and learning run in the workflow's own worker (local activities,
    # workflows.routing.run_here), inside the workflow task that asked for them.
    scheduled, local, tasks = activities_of("certified_after_two_rounds")
    assert set(scheduled) == {"check_candidate", "propose_fix"}
    assert set(local) == {"record_events", "retrieve_knowledge", "learn_from_session"}
    # The same session before the change: everything scheduled, a workflow task after each.
    scheduled_before, local_before, tasks_before = activities_of(
        "certified_after_two_rounds_before_local"
    )
    assert local_before == [] and "record_events" in scheduled_before
    assert len(scheduled_before) == len(scheduled) + len(local)
    assert tasks <= tasks_before / 2, (tasks, tasks_before)


RACES = Path(__file__).parent / "races"


def late_local_results(path: Path) -> int:
    """Local activities whose result reached the workflow's code one workflow task after their
    marker: the marker ends a completed task and the next task is scheduled at once, with
    nothing in between that asked for it (workflows.patches)."""
    events = json.loads(path.read_text())["events"]
    return sum(
        (before.get("markerRecordedEventAttributes") or {}).get("markerName")
        == "core_local_activity"
        and after["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED"
        for before, after in zip(events, events[1:], strict=False)
    )


async def test_a_local_result_that_reaches_the_code_a_task_late_replays():
    # Both recorded by `nearmiss repair` on a golden kernel with two busy loops on the two
    # cores: the first record_events finished while its workflow task was being completed. The
    # session from before decided its patches where it used them, one task early on a replay:
    # its replay fails (as its progress query did, live). Today's code decides at the start.
    before, today = RACES / "late_local_result.before_start.json", RACES / "late_local_result.json"
    assert late_local_results(before) == late_local_results(today) == 1
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    failed = await replayer.replay_workflow(load(before), raise_on_replay_failure=False)
    assert "patch marker encountered for change check-queues" in str(failed.replay_failure)
    assert (await replayer.replay_workflow(load(today))).replay_failure is None


def test_sessions_started_today_ask_no_patch_after_their_first_workflow_task():
    for path in [*HISTORIES, *RACES.glob("*.json")]:
        kinds = [
            e["eventType"].removeprefix("EVENT_TYPE_")
            for e in json.loads(path.read_text())["events"]
        ]
        # The first task's commands are the events between its completion and the next task.
        first_done = kinds.index("WORKFLOW_TASK_COMPLETED")
        next_task = kinds.index("WORKFLOW_TASK_SCHEDULED", first_done)
        patches = {i: patch for i, patch in enumerate(patch_ids(path)) if patch}
        if "decided-at-start" in patches.values():
            assert max(patches) < next_task, (path.name, patches)


def patch_ids(path: Path) -> list[str | None]:
    """Per event of a saved history: the patch id of a patch marker, else None."""
    ids = []
    for event in json.loads(path.read_text())["events"]:
        marker = event.get("markerRecordedEventAttributes") or {}
        data = (
            marker.get("details", {}).get("patch-data")
            if marker.get("markerName") == "core_patch"
            else None
        )
        ids.append(
            json.loads(base64.b64decode(data["payloads"][0]["data"]))["id"] if data else None
        )
    return ids
