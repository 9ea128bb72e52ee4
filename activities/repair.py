"""The repair activities: check a candidate, propose a fix, record events.

Thin wrappers: ``check`` (the sandboxed runner and integrity gate), a fixer, the event store.
Texts travel as blob hashes; each activity loads what it needs and stores what it makes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.agent import AgentActivities
from activities.evidence import evidence_from_report
from activities.fixers.base import Fixer, FixerError, to_activity_error
from activities.fixers.registry import make_fixer
from activities.fixers.replay import recorded_fix
from activities.fixers.search import OutOfTime, SearchFixer
from activities.placement import Placement
from activities.trim import trimmed
from kb.events import EventStore, NewEvent
from kb.knowledge import failed_attempts, retrieve
from kb.learning import learn_from_session
from kb.patches import apply_patch
from nearmiss.engine.check import check
from nearmiss.engine.errors import UsageError
from nearmiss.engine.models import Evidence
from workflows.models import (
    CheckInput,
    FixInput,
    FixOutcome,
    FixRequest,
    FixResult,
    RecordInput,
    RetrieveInput,
    RetrieveResult,
    is_kind,
)
from workflows.retries import DEADLINE_REACHED

HEARTBEAT_S = 5.0


def seconds_left() -> float | None:
    """Seconds until this activity's schedule-to-close timeout, which a repair session sets to
    the time left until its deadline (workflows.repair); None where it has none."""
    info = activity.info()
    if info.schedule_to_close_timeout is None or info.is_local:
        return None
    ends = info.scheduled_time.timestamp() + info.schedule_to_close_timeout.total_seconds()
    return ends - time.time()


def deadline_reached(what: str) -> ApplicationError:
    """The error of an activity the session's deadline leaves no time for: never retried, and
    the session stops with ``deadline`` (benign: the worker does not log it as a failure)."""
    return ApplicationError(
        f"the session's deadline came before {what}",
        type=DEADLINE_REACHED,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


def require_time(what: str) -> None:
    """Refuse at once to start work after the session's deadline (its activity was scheduled
    with a token timeout, ``workflows.repair.LEAST_TIMEOUT_S``)."""
    left = seconds_left()
    if left is not None and left <= 0:
        raise deadline_reached(what)


async def stored_outcome(store: EventStore, result: FixResult, model: str) -> FixOutcome:
    """A fixer's (or generator's) answer as the workflow sees it: its texts by blob hash."""
    outcome = FixOutcome(
        summary=result.summary,
        reason=result.reason,
        model=result.model or model,
        tokens=result.tokens,
        resume_at=result.resume_at,
        model_requests=result.model_requests,
        model_s=result.model_s,
    )
    if result.prompt:
        outcome.prompt_hash = await store.put_blob(result.prompt.encode())
    if result.response:
        outcome.response_hash = await store.put_blob(result.response.encode())
    if result.source is not None:
        outcome.candidate_hash = await store.put_blob(result.source.encode())
    return outcome


async def with_heartbeats(work):
    """Await ``work`` while telling Temporal we are alive, so a dead worker is noticed fast."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_S)
        if done:
            return task.result()
        activity.heartbeat()


class RepairActivities:
    def __init__(
        self,
        store: EventStore,
        fixer_factory: Callable[[str], Fixer] = make_fixer,
        parallel_checks: int = 2,
        placement: Placement | None = None,
    ) -> None:
        self.store = store
        # The targets this worker serves (None: any, and checks say nothing of where they ran).
        self.placement = placement
        self.fixer_factory = fixer_factory
        # Each check runs two JAX processes; more at once than cores only slows all of them.
        self.checks = asyncio.Semaphore(parallel_checks)
        # The tool-using agent's rounds: model turns and experiments (they share the checks).
        self.agent = AgentActivities(
            store, fixer_factory, self.checks, self._learned_patch, with_heartbeats
        )

    @activity.defn(name="check_candidate")
    async def check_candidate(self, request: CheckInput) -> Evidence:
        require_time("the check")
        if self.placement is not None:
            self.placement.admit(request.targets)

        async def run_check(candidate_hash: str):
            files = self.store.checkout(
                request.spec_hash, candidate_hash, request.candidate_name, "check"
            )
            # Queued behind other checks or running one, the activity keeps heartbeating.
            async with self.checks, files as (spec_path, candidate_path):
                return await asyncio.to_thread(
                    check,
                    spec_path,
                    candidate_path,
                    request.suite,
                    request.seed,
                    integrity=request.integrity,
                    targets=tuple(request.targets) or None,
                    show_at=Path(request.candidate_folder) if request.candidate_folder else None,
                )

        candidate_hash, trimmed_away = request.candidate_hash, []
        try:
            report = await with_heartbeats(run_check(candidate_hash))
            if report.certified and request.trim_against and request.integrity == "enforce":
                candidate_hash, report, trimmed_away = await self._trimmed(
                    request, report, run_check
                )
        except UsageError as exc:
            raise ApplicationError(str(exc), type="UsageError", non_retryable=True) from exc
        report_hash = await self.store.put_blob(report.model_dump_json().encode())
        if request.integrity != "enforce":
            # The no-anti-cheat ablation: the loop must not act on the gate either (a violation
            # would zero the score and hold back certification). The violations stay listed, so
            # they are recorded and learning still refuses a candidate that has any.
            # Nor does a check certify without the gate: the ablation's "success" is the
            # numbers' verdict alone, which the experiment then re-checks with the gate.
            advisory = report.integrity.model_copy(update={"ok": True})
            report = report.model_copy(update={"integrity": advisory, "certified": report.passed})
        evidence = evidence_from_report(report, candidate_hash, report_hash)
        if trimmed_away:
            evidence.trimmed_from, evidence.trimmed = request.candidate_hash, trimmed_away
        if self.placement is not None:
            evidence.worker = self.placement.record()
        return evidence

    async def _trimmed(self, request: CheckInput, report: Any, run_check: Any) -> tuple:
        """The certified candidate with the changes it does not need put back as the original
        had them (``activities.trim``): ``(its hash, its report, what was put back)``."""
        original = (await self.store.get_blob(request.trim_against)).decode()
        fixed = (await self.store.get_blob(request.candidate_hash)).decode()

        async def certifies(text: str) -> Any:
            trial = await with_heartbeats(run_check(await self.store.put_blob(text.encode())))
            return trial if trial.certified else None

        text, trimmed_report, said = await trimmed(original, fixed, certifies)
        if trimmed_report is None:
            return request.candidate_hash, report, []
        return await self.store.put_blob(text.encode()), trimmed_report, said

    @activity.defn(name="propose_fix")
    async def propose_fix(self, request: FixInput) -> FixOutcome:
        if is_kind(request.model, replay=True):  # a recorded session's answers, not a model
            return await recorded_fix(self.store, request)
        require_time("the fix")
        source = (await self.store.get_blob(request.candidate_hash)).decode()
        patched = await self._learned_patch(request, source)
        if patched is not None:
            return patched
        spec = (await self.store.get_blob(request.spec_hash)).decode()
        fixer = self.fixer_factory(request.model)
        left = seconds_left()
        if left is not None and isinstance(fixer, SearchFixer):
            fixer = fixer.within(left)  # the search screens only while the session has time
        fix_request = FixRequest.of(request, spec, source)
        try:
            result = await with_heartbeats(fixer.propose(fix_request))
        except FixerError as exc:
            raise to_activity_error(exc) from exc
        except OutOfTime as exc:
            raise deadline_reached(f"the search found an edit ({exc})") from exc
        return await stored_outcome(self.store, result, request.model)

    @activity.defn(name="retrieve_knowledge")
    async def retrieve_knowledge(self, request: RetrieveInput) -> RetrieveResult:
        held_out = ""
        if request.hold_out_for:  # the held-out split: nothing written from this kernel
            held_out = (await self.store.get_blob(request.hold_out_for)).decode()
        entries, patches = await retrieve(
            self.store, request.evidence, request.budget_chars, held_out=held_out
        )
        negative = await failed_attempts(self.store, request.evidence)
        return RetrieveResult(
            entry_ids=[e.id for e in entries],
            lines=[e.line() for e in entries] + negative,
            patches=[{"entry_id": p.id, "diff": p.body["diff"]} for p in patches],
        )

    @activity.defn(name="learn_from_session")
    async def learn_from_session(self, session_id: str) -> str:
        return await learn_from_session(self.store, session_id)

    async def _learned_patch(self, request: FixInput, source: str) -> FixOutcome | None:
        """Zero tokens first: a diff learned from an earlier certified repair, if one applies."""
        for patch in request.patches:
            name = f"patch:{patch['entry_id']}"
            if name in request.tried:
                continue
            edited = apply_patch(patch["diff"], source)
            if edited is not None:
                return FixOutcome(
                    candidate_hash=await self.store.put_blob(edited.encode()),
                    summary=name,
                    model="learned-patch",
                )
        return None

    @activity.defn(name="record_events")
    async def record_events(self, request: RecordInput) -> list[int]:
        events = [NewEvent(e["type"], e["payload"]) for e in request.events]
        return await self.store.append(request.stream_id, request.expected_version, events)

    def check_like(self) -> list:
        """The activities that run candidate code for a target: on the target's queue."""
        return [self.check_candidate, self.agent.run_tool]

    def general(self) -> list:
        """The rest (model calls, recording, retrieval, learning): on the general queue."""
        return [
            self.retrieve_knowledge,
            self.propose_fix,
            self.record_events,
            self.learn_from_session,
            self.agent.agent_step,
        ]
