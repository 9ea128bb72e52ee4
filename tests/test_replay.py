"""Saved histories still replay against today's workflow code (determinism check).

Regenerate with `python tests/make_histories.py` only after an intended change; a history that
stops replaying means running sessions would break on upgrade.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from workflows.repair import RepairWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_there_are_histories_to_replay():
    assert len(HISTORIES) >= 3


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_saved_history_replays(path):
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[RepairWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None


async def test_a_changed_command_sequence_is_caught(monkeypatch):
    # Control: replay must be able to fail. Recording one extra event first changes the
    # workflow's commands, which the replayer has to reject.
    original = RepairWorkflow._record

    async def record_twice(self, events):
        if events and self.version == 0:
            await original(self, events[:1])
        await original(self, events)

    monkeypatch.setattr(RepairWorkflow, "_record", record_twice)
    path = HISTORIES[0]
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[RepairWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),  # the sandbox would re-import the original
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
