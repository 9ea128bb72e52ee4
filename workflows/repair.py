"""RepairWorkflow: the Temporal workflow that drives the pure loop of ``workflows.loop``.

It owns no logic of its own: it runs the action the loop asks for as an activity, feeds the
result back, and records the loop's events through the ``record_events`` activity at versions it
tracks itself — so a retried recording is a no-op and a replayed workflow records nothing new.
Activities are referenced by name: this module imports nothing with I/O.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from nearmiss.engine.models import Evidence
    from nearmiss.events import RepairStarted
    from workflows.agent_round import run_agent_round
    from workflows.loop import Action, Guards, LoopState, PlannedEvent, RepairLoop
    from workflows.models import (
        CheckInput,
        FixInput,
        FixOutcome,
        RepairResult,
        RetrieveInput,
        RetrieveResult,
        TokenUsage,
        is_kind,
    )
    from workflows.patches import (
        AGENT_TOOLS,
        LEARN_FROM_SESSION,
        RETRIEVE_KNOWLEDGE,
        UNEDITED_IN_BEAM,
        decide_at_start,
        has,
    )
    from workflows.recording import record
    from workflows.retries import DEADLINE_REACHED, infra_retry
    from workflows.routing import GENERAL_QUEUE, check_options, no_worker_reason, run_here

TASK_QUEUE = GENERAL_QUEUE  # the workflows' queue; checks go to their target's (routing)
KERNEL_ATTRIBUTE = SearchAttributeKey.for_keyword("NearmissKernel")
VERDICT_ATTRIBUTE = SearchAttributeKey.for_keyword("NearmissVerdict")
TOKENS_ATTRIBUTE = SearchAttributeKey.for_int("NearmissTokens")

# Every activity rides out the infrastructure for minutes (workflows.retries); the engine's own
# bugs and unusable input fail at once.
CHECK_OPTIONS: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(minutes=30),
    heartbeat_timeout=timedelta(seconds=15),
    retry_policy=infra_retry("UsageError"),
)
FIX_OPTIONS: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(minutes=10),
    heartbeat_timeout=timedelta(seconds=15),
    retry_policy=infra_retry(),
)
RETRIEVE_OPTIONS: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=60),
    retry_policy=infra_retry(),
)
# The session's deadline bounds every check and fix: each is scheduled with the time left as
# its schedule-to-close timeout (retries included), so Temporal ends one still running when the
# deadline comes and the session stops then with ``deadline``, not when the activity is done.
# At least this long, as Temporal wants a positive timeout: an activity that starts with no time
# left refuses at once (``DEADLINE_REACHED``, activities.repair).
LEAST_TIMEOUT_S = 1.0


def ran_out_of_time(err: ActivityError) -> bool:
    """Whether an activity failed because the session's deadline came (its schedule-to-close
    timeout, or its own refusal to start without time left)."""
    cause = err.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_CLOSE:
        return True
    return isinstance(cause, ApplicationError) and cause.type == DEADLINE_REACHED


class RepairRequest(BaseModel):
    spec_hash: str
    candidate_hash: str
    candidate_name: str
    kernel: str  # the operator's name, for search
    model: str = "playbook"
    guards: Guards = Field(default_factory=Guards)
    seed: int = 0
    use_kb: bool = True  # False: the no-knowledge ablation
    # "held_out": no entry written from this kernel's own code is retrieved, so an evaluation
    # on the bundled corpus does not hand the corpus's fixes back (``Entry.hands_over``).
    knowledge: Literal["all", "held_out"] = "all"
    knowledge_budget_chars: int = 4000
    # "report": the no-anti-cheat ablation (violations listed, never blocking); "off": no gate.
    integrity: Literal["enforce", "report", "off"] = "enforce"
    # "compact": the ablation without full-coverage evaluation (certify on the compact suite).
    certify_suite: Literal["all", "compact"] = "all"
    # False: the knowledge base does not learn from this session, e.g. so that the trials of an
    # experiment stay independent (a learned patch would hand trial 2 the answer of trial 1).
    learn: bool = True
    # Where the kernel must be right (nearmiss.engine.targets); empty: the spec's, else interpret.
    targets: list[str] = Field(default_factory=list)
    # The folder the user keeps the candidate in: where every check shows it to the candidate,
    # as a plain import there would (empty: the engine's own, runner.sandbox.CODE_MOUNT).
    candidate_folder: str = ""


class Progress(BaseModel):
    phase: str = "starting"
    round: int = 0
    failure_class: str | None = None
    score: float | None = None
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    stop_reason: str | None = None
    events_recorded: int = 0
    tool_calls: int = 0
    # What the last round's fixer proposed (a recipe's name, a model's summary).
    last_fix: str = ""


class CutShort(NamedTuple):
    """A fix the session's deadline ended, with the tokens its model turns had already taken."""

    tokens: TokenUsage


@workflow.defn(name="RepairWorkflow")
class RepairWorkflow:
    def __init__(self) -> None:
        self.loop: RepairLoop | None = None
        self.version = 0  # of this session's event stream
        self.phase = "starting"

    @workflow.query
    def progress(self) -> Progress:
        if self.loop is None:
            return Progress()
        state = self.loop.state
        evidence = state.current_evidence
        return Progress(
            phase=self.phase,
            round=len(state.rounds),
            failure_class=evidence.failure_class if evidence else None,
            score=evidence.score if evidence else None,
            tokens=state.tokens,
            stop_reason=state.stop_reason,
            events_recorded=self.version,
            tool_calls=state.tool_calls,
            last_fix=state.rounds[-1].summary if state.rounds else "",
        )

    @workflow.run
    async def run(self, request: RepairRequest) -> RepairResult:
        decide_at_start()
        # The deadline counts from the first workflow task: a time read after an await may be
        # read in another task on a replay than live (workflows.patches).
        started_at = self._now()
        # (A fixer a test plugs in under a name of its own has none of the kinds' properties.)
        state = LoopState(
            guards=request.guards,
            deterministic_fixer=is_kind(request.model, deterministic=True),
            certify_suite=request.certify_suite,
            use_kb=request.use_kb,
            # A chat model may run experiments before its edit, where the guards allow any.
            tool_rounds=(
                is_kind(request.model, chat=True) and request.guards.max_tool_calls_per_round > 0
            ),
            learn=request.learn,
            keep_unedited=has(UNEDITED_IN_BEAM) and is_kind(request.model, screens=True),
        )
        self.loop = loop = RepairLoop(state)
        workflow.upsert_search_attributes(
            [KERNEL_ATTRIBUTE.value_set(request.kernel), VERDICT_ATTRIBUTE.value_set("running")]
        )
        started = RepairStarted.model_validate(request.model_dump(mode="json"))
        await self._record([PlannedEvent.of(started)])
        step = loop.begin(request.candidate_hash, started_at)
        while True:
            await self._record(step.events)
            action = step.action
            self.phase = action.kind
            if action.kind == "stop":
                break
            if action.kind == "retrieve":
                step = loop.on_retrieved(await self._retrieve(request))
                continue  # no tokens spent: the search attribute stays as it is
            if action.kind == "fix":
                fixed = await self._fix(request, action)
                if isinstance(fixed, CutShort):
                    during = f"round {len(state.rounds) + 1}'s fix"
                    step = loop.on_deadline(self._now(), during, spent=fixed.tokens)
                else:
                    step = loop.on_fix(*fixed)
            else:
                check = CheckInput(
                    spec_hash=request.spec_hash,
                    candidate_hash=action.candidate_hash,
                    candidate_name=request.candidate_name,
                    suite=action.suite,
                    # Each check draws its own seed: certification runs on fresh inputs.
                    seed=workflow.random().randint(0, 2**31 - 1),
                    integrity=request.integrity,
                    targets=request.targets,
                    candidate_folder=request.candidate_folder,
                    # A candidate certified is handed back without changes it does not need.
                    trim_against=(
                        state.original_hash
                        if action.kind == "certify" and action.candidate_hash != state.original_hash
                        else ""
                    ),
                )
                wait = request.guards.worker_wait_s
                options = self._bounded(CHECK_OPTIONS, request.guards)
                try:
                    evidence = await workflow.execute_activity(
                        "check_candidate",
                        check,
                        result_type=Evidence,
                        **check_options(options, request.targets, wait),
                    )
                except ActivityError as err:
                    if ran_out_of_time(err):
                        step = loop.on_deadline(self._now(), f"the {action.kind} check")
                        continue
                    reason = no_worker_reason(err, request.targets, wait)
                    if reason is None:
                        raise
                    step = loop.on_no_worker(reason)
                    continue
                step = loop.on_evidence(action, evidence, self._now())
            workflow.upsert_search_attributes([TOKENS_ATTRIBUTE.value_set(state.tokens.total)])
        result = loop.result(workflow.info().workflow_id)
        workflow.upsert_search_attributes(
            [VERDICT_ATTRIBUTE.value_set("certified" if state.certified else result.stop_reason)]
        )
        step = loop.finish(result)
        await self._record(step.events)
        # The knowledge base learns from the log of this session (quality-gated there).
        if step.action.kind == "learn" and has(LEARN_FROM_SESSION):
            await run_here(
                "learn_from_session", result.session_id, result_type=str, **RETRIEVE_OPTIONS
            )
        return result

    async def _retrieve(self, request: RepairRequest) -> RetrieveResult | None:
        assert self.loop is not None and self.loop.state.current_evidence is not None
        # Sessions started before retrieval existed replay without it.
        if not has(RETRIEVE_KNOWLEDGE):
            return None
        return await run_here(
            "retrieve_knowledge",
            RetrieveInput(
                evidence=self.loop.state.current_evidence,
                budget_chars=request.knowledge_budget_chars,
                hold_out_for=request.candidate_hash if request.knowledge == "held_out" else "",
            ),
            result_type=RetrieveResult,
            **RETRIEVE_OPTIONS,
        )

    async def _fix(
        self, request: RepairRequest, action: Action
    ) -> tuple[FixOutcome, float] | CutShort:
        """The fix's outcome and the time it ended; ``CutShort`` when the deadline came first."""
        assert self.loop is not None  # run() made it before the first round
        state = self.loop.state
        evidence = self.loop.evidence_of(action.candidate_hash)
        assert evidence is not None  # a fix always follows a check
        fix = FixInput(
            spec_hash=request.spec_hash,
            candidate_hash=action.candidate_hash,
            candidate_name=request.candidate_name,
            evidence=evidence,
            round=len(state.rounds) + 1,
            model=request.model,
            tried=list(state.tried),
            knowledge=action.knowledge,
            patches=action.patches,
            skip=state.searched.get(action.candidate_hash, 0),
        )
        guards = request.guards
        if guards.token_budget is not None:  # bounds the model's answers (max_tokens)
            fix.tokens_left = guards.token_budget - state.tokens.total
        options = self._bounded(FIX_OPTIONS, guards)
        # Sessions from before the agent replay without its tool rounds.
        if action.tool_round and has(AGENT_TOOLS):
            outcome, ended = await run_agent_round(
                fix,
                options,
                # The experiments too end at the deadline (the model hears the tool failed).
                check_options(self._bounded({}, guards), request.targets, guards.worker_wait_s),
                per_round=guards.max_tool_calls_per_round,
                tools_left=guards.max_tool_calls - state.tool_calls,
                tokens_left=fix.tokens_left,
                record=self._record,
                token_budget=guards.token_budget,
            )
            # A model turn the deadline cut short fails the round: the deadline ended it. (By
            # the time the round ended: a time read after its recording, a local activity,
            # may be another live than on a replay, workflows.patches.)
            if outcome.fatal and self._left(guards, ended) <= 0:
                return CutShort(outcome.tokens)
            return outcome, ended
        try:
            outcome = await workflow.execute_activity(
                "propose_fix", fix, result_type=FixOutcome, **options
            )
        except ActivityError as err:  # retries exhausted, or a non-retryable model error
            if ran_out_of_time(err):
                return CutShort(TokenUsage())
            cause = err.cause or err
            reason = f"the fixer failed: {cause}"
            outcome = FixOutcome(fatal=True, reason=reason, model=request.model)
        return outcome, self._now()

    async def _record(self, events: list[PlannedEvent]) -> None:
        self.version = await record(self.version, events)

    def _left(self, guards: Guards, now: float | None = None) -> float:
        """Seconds left until the session's deadline at ``now`` (default: this workflow task's
        time); negative once it has passed."""
        now = self._now() if now is None else now
        started = self.loop.state.started_at if self.loop is not None else now
        return guards.deadline_s - (now - started)

    def _bounded(self, options: dict[str, Any], guards: Guards) -> dict[str, Any]:
        """``options`` with the time left until the deadline as the schedule-to-close timeout
        (see ``LEAST_TIMEOUT_S``)."""
        left = max(self._left(guards), LEAST_TIMEOUT_S)
        return {**options, "schedule_to_close_timeout": timedelta(seconds=left)}

    @staticmethod
    def _now() -> float:
        return workflow.now().timestamp()
