"""FleetWorkflow: many repair sessions as child workflows, a bounded number at a time.

A fleet is a list of members (spec + candidate, both by blob hash). The workflow keeps at most
``concurrency`` RepairWorkflow children running, records one FleetMemberFinished event per
member in its own stream, and continues as new after ``members_per_run`` starts (or when Temporal
suggests it) so the history of a fleet of thousands stays small: the finished results and the
stream version travel into the next run. A crashed worker costs nothing — another worker replays
the fleet and its children where they were. Cancelling the fleet cancels the running children
and records what finished.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from nearmiss.events import Event, FleetFinished, FleetMemberFinished, FleetStarted
    from workflows.loop import Guards, PlannedEvent
    from workflows.models import RepairResult, TokenUsage
    from workflows.patches import decide_at_start
    from workflows.recording import record
    from workflows.repair import TASK_QUEUE, RepairRequest, RepairWorkflow


class FleetMember(BaseModel):
    name: str  # what the user calls it, e.g. "matmul/missing_init"
    kernel: str  # the spec's operator name
    spec_hash: str
    candidate_hash: str
    candidate_name: str
    # This member's targets (nearmiss.engine.targets); empty: the fleet's.
    targets: list[str] = Field(default_factory=list)
    candidate_folder: str = ""  # RepairRequest.candidate_folder


class MemberResult(BaseModel):
    index: int
    name: str
    session_id: str
    verdict: str  # "certified", the stop reason, "error" or "cancelled"
    certified: bool = False
    rounds: int = 0
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    detail: str = ""
    targets: dict[str, bool] = Field(default_factory=dict)  # judged by its last check


class FleetRequest(BaseModel):
    members: list[FleetMember]
    model: str = "playbook"
    guards: Guards = Field(default_factory=Guards)
    use_kb: bool = True
    concurrency: int = Field(default=4, ge=1)
    # The members' targets (nearmiss.engine.targets) where a member names none of its own.
    targets: list[str] = Field(default_factory=list)
    members_per_run: int = Field(default=200, ge=1)
    # Carried from one run to the next by continue-as-new:
    next_index: int = 0
    results: list[MemberResult] = Field(default_factory=list)
    version: int = 0  # of the fleet's event stream
    runs: int = 1


class RunningMember(BaseModel):
    index: int
    name: str
    session_id: str


class FleetProgress(BaseModel):
    total: int = 0
    finished: int = 0
    certified: int = 0
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    running: list[RunningMember] = Field(default_factory=list)
    results: list[MemberResult] = Field(default_factory=list)
    runs: int = 1  # how many workflow runs the fleet has taken (continue-as-new)


class FleetResult(BaseModel):
    fleet_id: str
    total: int
    certified: int
    cancelled: bool = False
    tokens: TokenUsage
    results: list[MemberResult]


def member_session_id(fleet_id: str, index: int, member: FleetMember) -> str:
    return f"{fleet_id}.{index:05d}-{member.kernel}"


def summarise(results: list[MemberResult]) -> tuple[int, TokenUsage]:
    tokens = TokenUsage()
    for r in results:
        tokens = tokens + r.tokens
    return sum(r.certified for r in results), tokens


@workflow.defn(name="FleetWorkflow")
class FleetWorkflow:
    def __init__(self) -> None:
        self.request: FleetRequest | None = None
        self.running: dict[int, RunningMember] = {}

    @property
    def started(self) -> FleetRequest:
        """The request of the run in progress (``run`` sets it before anything else)."""
        assert self.request is not None
        return self.request

    @workflow.query
    def progress(self) -> FleetProgress:
        if self.request is None:
            return FleetProgress()
        results = self.request.results
        certified, tokens = summarise(results)
        return FleetProgress(
            total=len(self.request.members),
            finished=len(results),
            certified=certified,
            tokens=tokens,
            running=sorted(self.running.values(), key=lambda m: m.index),
            results=results,
            runs=self.request.runs,
        )

    @workflow.run
    async def run(self, request: FleetRequest) -> FleetResult:
        decide_at_start()
        self.request = request
        fleet_id = workflow.info().workflow_id
        # Whether the server suggests a new run, read only where the task is the one a history
        # event started (at the start, after a child's start or end): after recording, a local
        # activity, the code may run in another task live than on a replay (workflows.patches).
        suggested = workflow.info().is_continue_as_new_suggested()
        if request.version == 0:
            started = FleetStarted(
                members=len(request.members),
                names=[m.name for m in request.members],
                model=request.model,
                guards=request.guards.model_dump(mode="json"),
                use_kb=request.use_kb,
                concurrency=request.concurrency,
            )
            await self._record(started)
        pending: dict[asyncio.Task, RunningMember] = {}
        started_here = 0
        try:
            while True:
                while (
                    request.next_index < len(request.members)
                    and len(pending) < request.concurrency
                    and started_here < request.members_per_run
                    and not suggested
                ):
                    task, member = await self._start(fleet_id, request.next_index)
                    suggested = workflow.info().is_continue_as_new_suggested()
                    pending[task] = member
                    request.next_index += 1
                    started_here += 1
                if not pending:
                    break
                done, _ = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                suggested = workflow.info().is_continue_as_new_suggested()
                for task in sorted(done, key=lambda t: pending[t].index):
                    await self._finish(pending.pop(task), task)
        except asyncio.CancelledError:
            for task in pending:
                task.cancel()
            for task, member in sorted(pending.items(), key=lambda kv: kv[1].index):
                await self._finish(member, task, cancelled=True)
            await self._record_finished(fleet_id, cancelled=True)
            raise
        if request.next_index < len(request.members):
            # Drained this run's children; the next run starts the rest on a fresh history.
            request.runs += 1
            workflow.continue_as_new(request)
        return await self._record_finished(fleet_id, cancelled=False)

    async def _start(self, fleet_id: str, index: int) -> tuple[asyncio.Task, RunningMember]:
        request = self.started
        member = request.members[index]
        session_id = member_session_id(fleet_id, index, member)
        repair = RepairRequest(
            spec_hash=member.spec_hash,
            candidate_hash=member.candidate_hash,
            candidate_name=member.candidate_name,
            kernel=member.kernel,
            model=request.model,
            guards=request.guards,
            use_kb=request.use_kb,
            targets=member.targets or request.targets,
            candidate_folder=member.candidate_folder,
        )
        handle = await workflow.start_child_workflow(
            RepairWorkflow.run, repair, id=session_id, task_queue=TASK_QUEUE
        )
        running = RunningMember(index=index, name=member.name, session_id=session_id)
        self.running[index] = running
        return asyncio.ensure_future(handle), running

    async def _finish(self, member: RunningMember, task: asyncio.Task, cancelled=False) -> None:
        """Record how one member ended; ``cancelled``: the fleet is being cancelled."""
        result = MemberResult(
            index=member.index,
            name=member.name,
            session_id=member.session_id,
            verdict="cancelled" if cancelled else "error",
        )
        try:
            repair: RepairResult = await task
        except (ChildWorkflowError, asyncio.CancelledError) as err:
            # A session that fails outright (not a stop of its loop) must not sink the fleet.
            cause = getattr(err, "cause", None) or err
            result.detail = str(cause) or type(cause).__name__
        else:
            result.verdict = "certified" if repair.certified else repair.stop_reason
            result.certified, result.rounds = repair.certified, repair.rounds
            result.tokens, result.detail = repair.tokens, repair.stop_detail
            result.targets = dict(repair.targets)
        self.running.pop(member.index, None)
        self.started.results.append(result)
        await self._record(FleetMemberFinished.model_validate(result.model_dump(mode="json")))

    async def _record_finished(self, fleet_id: str, cancelled: bool) -> FleetResult:
        results = sorted(self.started.results, key=lambda r: r.index)
        certified, tokens = summarise(results)
        result = FleetResult(
            fleet_id=fleet_id,
            total=len(self.started.members),
            certified=certified,
            cancelled=cancelled,
            tokens=tokens,
            results=results,
        )
        summary = FleetFinished(
            total=result.total,
            finished=len(results),
            certified=certified,
            cancelled=cancelled,
            tokens=tokens.model_dump(),
        )
        await self._record(summary)
        return result

    async def _record(self, event: Event) -> None:
        self.started.version = await record(self.started.version, [PlannedEvent.of(event)])
