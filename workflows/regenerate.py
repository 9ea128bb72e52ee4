"""RegenerateWorkflow: the baseline the repair loop is measured against.

Instead of debugging a near-miss, the model writes the whole kernel from the spec, ``trials``
times independently; each kernel is certified like any repair (all suites, integrity enforced).
Pass@1 is the mean over trials, Pass@k whether any trial certified. Like ``RepairWorkflow`` it
references activities by name, imports nothing with I/O, and records every step through the
``record_events`` activity at versions it tracks itself.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from nearmiss.engine.models import Evidence
    from nearmiss.events import KernelGenerated, RegenerateFinished, RegenerateStarted
    from workflows.guards import WORKER_WAIT_S
    from workflows.loop import PlannedEvent, evidence_collected
    from workflows.models import CheckInput, TokenUsage, is_kind
    from workflows.patches import decide_at_start
    from workflows.recording import record
    from workflows.repair import (
        CHECK_OPTIONS,
        FIX_OPTIONS,
        KERNEL_ATTRIBUTE,
        TOKENS_ATTRIBUTE,
    )
    from workflows.routing import check_options, no_worker_reason


class RegenerateRequest(BaseModel):
    spec_hash: str
    kernel: str  # the operator's name, for search
    candidate_name: str  # the file name the kernel is written to (and errors point at)
    model: str  # openai:MODEL; the playbook edits kernels, it cannot write one
    trials: int = Field(default=3, ge=1)
    seed: int = 0  # trial t asks the endpoint for seed + t, where it supports seeds
    # Independent samples need sampling: at temperature 0 every trial would give one answer.
    temperature: float = Field(default=0.7, ge=0)
    targets: list[str] = Field(default_factory=list)  # where a kernel must be right


class GenerateInput(BaseModel):
    spec_hash: str
    kernel: str
    candidate_name: str
    model: str
    trial: int
    seed: int
    temperature: float


class GeneratedKernel(BaseModel):
    """One trial's answer: texts by blob hash; no candidate when the answer held no kernel."""

    candidate_hash: str | None = None
    reason: str = ""  # why there is no candidate
    model: str = ""
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    prompt_hash: str = ""
    response_hash: str = ""


class TrialResult(BaseModel):
    trial: int
    certified: bool
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    candidate_hash: str | None = None
    failure_class: str | None = None
    report_hash: str = ""
    reason: str = ""  # why there was nothing to certify


class RegenerateResult(BaseModel):
    session_id: str
    kernel: str
    trials: list[TrialResult]
    pass_at_1: float  # mean over trials
    pass_at_k: bool  # any trial certified
    tokens: TokenUsage


@workflow.defn(name="RegenerateWorkflow")
class RegenerateWorkflow:
    def __init__(self) -> None:
        self.version = 0  # of this session's event stream
        # Trials run concurrently; their events must still take consecutive versions.
        self.recording = asyncio.Lock()

    @workflow.run
    async def run(self, request: RegenerateRequest) -> RegenerateResult:
        decide_at_start()
        if not is_kind(request.model, chat=True):
            raise ApplicationError(
                f"model {request.model!r} cannot write a kernel: regenerate needs openai:MODEL",
                type="UsageError",
                non_retryable=True,
            )
        workflow.upsert_search_attributes([KERNEL_ATTRIBUTE.value_set(request.kernel)])
        started = RegenerateStarted.model_validate(request.model_dump(mode="json"))
        await self._record([PlannedEvent.of(started)])
        trials = await asyncio.gather(
            *(self._trial(request, t) for t in range(1, request.trials + 1))
        )
        tokens = sum((t.tokens for t in trials), TokenUsage())
        result = RegenerateResult(
            session_id=workflow.info().workflow_id,
            kernel=request.kernel,
            trials=list(trials),
            pass_at_1=sum(t.certified for t in trials) / len(trials),
            pass_at_k=any(t.certified for t in trials),
            tokens=tokens,
        )
        workflow.upsert_search_attributes([TOKENS_ATTRIBUTE.value_set(tokens.total)])
        finished = RegenerateFinished.model_validate(result.model_dump(mode="json"))
        await self._record([PlannedEvent.of(finished)])
        return result

    async def _trial(self, request: RegenerateRequest, trial: int) -> TrialResult:
        generate = GenerateInput(
            spec_hash=request.spec_hash,
            kernel=request.kernel,
            candidate_name=request.candidate_name,
            model=request.model,
            trial=trial,
            seed=request.seed + trial,
            temperature=request.temperature,
        )
        try:
            generated = await workflow.execute_activity(
                "generate_kernel", generate, result_type=GeneratedKernel, **FIX_OPTIONS
            )
        except ActivityError as err:  # retries exhausted, or a non-retryable model error
            reason = f"the model failed: {err.cause or err}"
            generated = GeneratedKernel(reason=reason, model=request.model)
        kernel = KernelGenerated(trial=trial, **generated.model_dump(mode="json"))
        await self._record([PlannedEvent.of(kernel)])
        result = TrialResult(
            trial=trial,
            certified=False,
            tokens=generated.tokens,
            candidate_hash=generated.candidate_hash,
            reason=generated.reason,
        )
        if generated.candidate_hash is not None:
            await self._certify(request, result)
        return result

    async def _certify(self, request: RegenerateRequest, result: TrialResult) -> None:
        """The engine's verdict on a generated kernel: the full suite, integrity enforced."""
        assert result.candidate_hash is not None  # only a trial that wrote a kernel comes here
        check = CheckInput(
            spec_hash=request.spec_hash,
            candidate_hash=result.candidate_hash,
            candidate_name=request.candidate_name,
            suite="all",
            seed=workflow.random().randint(0, 2**31 - 1),
            integrity="enforce",
            targets=request.targets,
        )
        try:
            evidence = await workflow.execute_activity(
                "check_candidate",
                check,
                result_type=Evidence,
                **check_options(CHECK_OPTIONS, request.targets, WORKER_WAIT_S),
            )
        except ActivityError as err:  # e.g. a file that binds no `kernel`: unusable, not certified
            no_worker = no_worker_reason(err, request.targets, WORKER_WAIT_S)
            result.reason = no_worker or f"the check refused the kernel: {err.cause or err}"
            return
        collected = evidence_collected(evidence, "regenerate", trial=result.trial)
        await self._record([PlannedEvent.of(collected)])
        result.certified = evidence.certified
        result.failure_class = evidence.failure_class
        result.report_hash = evidence.report_hash

    async def _record(self, events: list[PlannedEvent]) -> None:
        async with self.recording:
            self.version = await record(self.version, events)
