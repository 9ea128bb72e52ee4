"""The typed event models (nearmiss.events): every event the saved histories recorded fits its
model unchanged, and a writer with a wrong payload fails where it writes, in both stores and in
a workflow's planned events."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from kb.events import NewEvent
from kb.memory import MemoryEventStore
from nearmiss.events import (
    EVENTS,
    EvidenceCollected,
    FixProposed,
    GuardTripped,
    InvalidEvent,
    parse,
)
from workflows.loop import PlannedEvent

HISTORIES = Path(__file__).parent / "histories"


def recorded_events() -> list[tuple[str, str, dict]]:
    """(history, type, payload) of every event a saved history's workflows asked to record:
    the inputs of their record_events activities, as Temporal stored them."""
    found = []
    for path in sorted(HISTORIES.glob("*.json")):
        for event in json.loads(path.read_text())["events"]:
            scheduled = event.get("activityTaskScheduledEventAttributes")
            if not scheduled or scheduled["activityType"]["name"] != "record_events":
                continue
            for raw in scheduled["input"]["payloads"]:
                request = json.loads(base64.b64decode(raw["data"]))
                found += [(path.name, e["type"], e["payload"]) for e in request["events"]]
    return found


def test_every_event_of_the_saved_histories_fits_its_model_and_dumps_back_the_same():
    events = recorded_events()
    assert len(events) > 50
    seen = set()
    for history, event_type, payload in events:
        typed = parse(event_type, payload)
        assert typed.payload() == payload, (history, event_type)
        seen.add(event_type)
    # The histories cover the repair loop, the agent, fleets and regenerate sessions.
    assert {"RepairStarted", "FixProposed", "ToolCalled", "FleetMemberFinished"} <= seen
    assert {"RegenerateStarted", "KernelGenerated", "RegenerateFinished"} <= seen


def test_the_log_knows_exactly_the_modelled_types_each_named_for_its_class():
    assert all(model.TYPE == name == model.__name__ for name, model in EVENTS.items())
    assert len(EVENTS) == 21


def test_a_typed_event_dumps_only_what_its_writer_set():
    fix = FixProposed(
        round=1,
        model="playbook",
        summary="s",
        reason="r",
        base_hash="a",
        candidate_hash=None,
        tokens={"input": 0},
    )
    assert "resume_at" not in fix.payload() and fix.payload()["candidate_hash"] is None
    assert parse("FixProposed", fix.payload()) == fix


@pytest.mark.parametrize(
    ("event_type", "payload", "says"),
    [
        ("GuardTripped", {"guard": "max_rounds"}, "detail: Field required"),
        ("GuardTripped", {"guard": "x", "detail": "y", "detial": "z"}, "detial: Extra inputs"),
        ("EvidenceCollected", {"phase": "validate"}, "candidate_hash: Field required"),
        ("RepairDone", {}, "unknown event type 'RepairDone'"),
    ],
)
async def test_a_wrong_payload_fails_at_the_writer_in_every_store(event_type, payload, says):
    with pytest.raises(ValueError, match=says):  # pydantic's, around InvalidEvent's message
        PlannedEvent(type=event_type, payload=payload)  # a workflow's
    with pytest.raises(InvalidEvent, match=says):
        NewEvent(event_type, payload)  # what both stores append
    store = MemoryEventStore()
    good = GuardTripped(guard="max_rounds", detail="6 rounds").payload()
    await store.append("s", 0, [NewEvent("GuardTripped", good)])
    assert [e.payload for e in await store.read_stream("s")] == [good]


def test_older_events_without_later_fields_still_parse():
    older = {"phase": "forensics", "candidate_hash": "h", "suite": "compact", "certified": False}
    assert parse("EvidenceCollected", older) == EvidenceCollected(**older)


def test_events_that_record_a_workflow_model_declare_exactly_its_fields():
    """A field added to a workflow's request or result must be added to its event too (the
    model forbids undeclared keys, so the first session would fail): said here first."""
    from workflows.fleet import MemberResult
    from workflows.models import RepairResult
    from workflows.regenerate import GeneratedKernel, RegenerateRequest, RegenerateResult
    from workflows.repair import RepairRequest

    pairs = [
        (RepairRequest, "RepairStarted", set()),
        (RepairResult, "RepairFinished", set()),
        (RegenerateRequest, "RegenerateStarted", set()),
        (RegenerateResult, "RegenerateFinished", set()),
        (GeneratedKernel, "KernelGenerated", {"trial"}),
        (MemberResult, "FleetMemberFinished", set()),
    ]
    for workflow_model, event_type, added in pairs:
        event_fields = set(EVENTS[event_type].model_fields)
        assert set(workflow_model.model_fields) | added == event_fields, event_type
