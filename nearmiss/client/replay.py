"""`nearmiss replay SESSION`: audit a past repair session three ways.

1. Determinism: its Temporal history replays against today's workflow code (the Replayer); a
   failure means sessions in flight would break on upgrade.
2. Re-run: a new session on the same spec and candidate whose fixer is the recording itself
   (``replay:SESSION``: round N proposes what round N proposed; no model, no tokens), checked by
   today's JAX on today's hardware; the steps are compared and every change in behaviour named.
3. Timeline: evidence, knowledge used, edits, tool calls, verdicts and tokens, as recorded.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from kb.events import EventStore, StoredEvent
from nearmiss.client.service import WORKFLOWS
from nearmiss.engine.errors import UsageError
from nearmiss.engine.models import CheckReport
from nearmiss.events import EvidenceCollected, of_type
from workflows.models import RepairResult, replay_model
from workflows.repair import TASK_QUEUE, RepairRequest, RepairWorkflow

SCORE_TOLERANCE = 0.05  # fresh inputs move a score a little; a change beyond this is behaviour


@dataclass
class DeterminismCheck:
    ok: bool
    detail: str
    history_events: int = 0


@dataclass
class Step:
    """One check of the session, as compared between the recording and the re-run."""

    phase: str
    candidate_hash: str
    certified: bool
    failure_class: str | None
    score: float
    platform: str = ""
    jax_version: str = ""


@dataclass
class Comparison:
    rerun_id: str
    original: RepairResult
    rerun: RepairResult
    steps: list[tuple[Step | None, Step | None]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)

    @property
    def same_behaviour(self) -> bool:
        return not self.changes


async def check_determinism(client: Client, session_id: str) -> DeterminismCheck:
    try:
        history = await client.get_workflow_handle(session_id).fetch_history()
    except RPCError as exc:
        return DeterminismCheck(False, f"no Temporal history for {session_id}: {exc.message}")
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    size = len(history.events)
    if result.replay_failure is not None:
        return DeterminismCheck(False, f"replay failed: {result.replay_failure}", size)
    return DeterminismCheck(True, f"{size} history events replay against today's code", size)


async def recorded_request(store: EventStore, session_id: str) -> RepairRequest:
    events = await store.read_stream(session_id)
    if not events or events[0].type != "RepairStarted":
        raise UsageError(f"no repair session {session_id} in the event store")
    return RepairRequest.model_validate(events[0].payload)


async def rerun(client: Client, store: EventStore, session_id: str):
    """Start the re-run with the recorded answers; returns its workflow handle."""
    request = await recorded_request(store, session_id)
    request.model = replay_model(session_id)
    # The recording decides every edit: no retrieval, and nothing learned from a re-run.
    request.use_kb = False
    request.learn = False
    rerun_id = f"rerun-{session_id}-{uuid.uuid4().hex[:6]}"
    return await client.start_workflow(
        RepairWorkflow.run, request, id=rerun_id, task_queue=TASK_QUEUE
    )


async def _steps(store: EventStore, events: list[StoredEvent]) -> list[Step]:
    steps = []
    for p in of_type(events, EvidenceCollected):
        step = Step(p.phase, p.candidate_hash, p.certified, p.failure_class, p.score)
        if p.report_hash:
            report = CheckReport.model_validate_json(await store.get_blob(p.report_hash))
            step.platform, step.jax_version = report.platform, report.jax_version
        steps.append(step)
    return steps


def _finished(events: list[StoredEvent]) -> RepairResult:
    return RepairResult.model_validate(events[-1].payload)


async def compare(store: EventStore, session_id: str, rerun_id: str) -> Comparison:
    before = await store.read_stream(session_id)
    after = await store.read_stream(rerun_id)
    old_steps, new_steps = await _steps(store, before), await _steps(store, after)
    comparison = Comparison(rerun_id, _finished(before), _finished(after))
    for index in range(max(len(old_steps), len(new_steps))):
        old = old_steps[index] if index < len(old_steps) else None
        new = new_steps[index] if index < len(new_steps) else None
        comparison.steps.append((old, new))
        comparison.changes += _step_changes(index + 1, old, new)
    o, r = comparison.original, comparison.rerun
    if (o.certified, o.stop_reason, o.rounds) != (r.certified, r.stop_reason, r.rounds):
        comparison.changes.append(f"outcome: recorded {outcome(o)}, re-run {outcome(r)}")
    return comparison


def outcome(result: RepairResult) -> str:
    verdict = "certified" if result.certified else result.stop_reason
    return f"{verdict} after {result.rounds} round(s)"


def _step_changes(number: int, old: Step | None, new: Step | None) -> list[str]:
    if old is None:
        assert new is not None  # (a check is in the recording, the re-run or both)
        return [f"check {number}: only in the re-run ({new.phase}, {verdict(new)})"]
    if new is None:
        return [f"check {number}: only in the recording ({old.phase}, {verdict(old)})"]
    changes = []
    where = f"check {number} ({old.phase})"
    if old.candidate_hash != new.candidate_hash:
        changes.append(f"{where}: a different candidate was checked")
    if (old.certified, old.failure_class) != (new.certified, new.failure_class):
        changes.append(f"{where}: recorded {verdict(old)}, now {verdict(new)}")
    elif abs(old.score - new.score) > SCORE_TOLERANCE:
        changes.append(f"{where}: score {old.score:.2f} → {new.score:.2f}")
    return changes


def verdict(step: Step) -> str:
    return "certified" if step.certified else (step.failure_class or "failing")
