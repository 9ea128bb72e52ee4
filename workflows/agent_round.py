"""One fix round of the tool-using agent, as workflow code (deterministic, activities by name).

    agent_step ─► tool calls? ─► run_tool each (recorded as ToolCalled) ─► agent_step ─► ...
         └─► outcome (an edit, or none with its reason) ends the round

Bounded three ways: tool calls per round and per repair (the guards; calls beyond them are
answered "not run"), the session's token budget, and a cap on model turns per round. Every
model turn and every tool call is an activity, so a worker restart mid-round resumes where the
history says, running nothing twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from nearmiss.events import ToolCalled
    from workflows.loop import PlannedEvent
    from workflows.models import (
        AgentStep,
        AgentStepInput,
        FixInput,
        FixOutcome,
        TokenUsage,
        ToolAnswer,
        ToolCall,
        ToolInput,
    )
    from workflows.retries import infra_retry

TOOL_OPTIONS: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(minutes=10),
    heartbeat_timeout=timedelta(seconds=15),
    retry_policy=infra_retry(),
)
EXTRA_TURNS = 3  # model turns beyond one per allowed tool call (bad edits, malformed calls)
RECORDED_CHARS = 600  # of a call's arguments and answer in its ToolCalled event


def _clip(text: str) -> str:
    return text if len(text) <= RECORDED_CHARS else text[:RECORDED_CHARS] + "…"


def _called(round_: int, answer: ToolAnswer, ran: bool) -> PlannedEvent:
    called = ToolCalled(
        round=round_,
        call_id=answer.call_id,
        tool=answer.tool,
        arguments=_clip(answer.arguments),
        ran=ran,
        ok=answer.ok,
        summary=_clip(answer.content),
        data_hash=answer.data_hash,
    )
    return PlannedEvent.of(called)


async def run_agent_round(
    fix: FixInput,
    fix_options: dict,
    tool_routing: dict,
    *,
    per_round: int,
    tools_left: int,
    tokens_left: int | None,
    record: Callable[[list[PlannedEvent]], Awaitable[None]],
) -> tuple[FixOutcome, float]:
    """The round's outcome, with the tokens of all its turns and the tool calls it ran, and
    the time it ended (``workflow.now()``, read before its last recording: after a recording,
    a local activity, the code may run in another workflow task live than on a replay, see
    workflows.patches). ``tool_routing``: the task queue options of the experiments
    (workflows.routing)."""
    budget = max(0, min(per_round, tools_left))
    step_input = AgentStepInput(fix=fix, tool_budget=budget, tools_allowed=budget > 0)
    tokens, ran, ended = TokenUsage(), 0, _now()
    for _turn in range(budget + EXTRA_TURNS):
        try:
            step = await workflow.execute_activity(
                "agent_step", step_input, result_type=AgentStep, **fix_options
            )
        except ActivityError as err:  # retries exhausted, or a non-retryable model error
            reason = f"the fixer failed: {err.cause or err}"
            return FixOutcome(fatal=True, reason=reason, model=fix.model, tokens=tokens), _now()
        tokens = tokens + step.tokens
        answers = list(step.answered)
        events = [_called(fix.round, answer, ran=False) for answer in step.answered]
        if step.outcome is not None:
            ended = _now()
            await record(events)  # e.g. calls refused because the round had to end
            return step.outcome.model_copy(update={"tokens": tokens, "tool_calls": ran}), ended
        for call in step.calls:
            if ran >= budget:
                answer = ToolAnswer.to(call, "not run: the tool budget of this round is spent")
                events.append(_called(fix.round, answer, ran=False))
            else:
                answer = await _run_tool(fix, call, tool_routing)
                ran += 1
                events.append(_called(fix.round, answer, ran=True))
            answers.append(answer)
        ended = _now()
        await record(events)
        if tokens_left is not None and tokens.total >= tokens_left:
            reason = "the token budget ran out during the round's experiments"
            return FixOutcome(reason=reason, model=fix.model, tokens=tokens, tool_calls=ran), ended
        left = budget - ran
        note = (
            f"{left} tool call(s) left this round."
            if left > 0
            else "The tool budget of this round is spent: answer now with your edit."
        )
        step_input = AgentStepInput(
            fix=fix,
            conversation_hash=step.conversation_hash,
            answers=answers,
            tools_allowed=left > 0,
            tool_budget=budget,
            note=note,
        )
    reason = f"no edit after {budget + EXTRA_TURNS} model turns"
    return FixOutcome(reason=reason, model=fix.model, tokens=tokens, tool_calls=ran), ended


def _now() -> float:
    return workflow.now().timestamp()


async def _run_tool(fix: FixInput, call: ToolCall, routing: dict) -> ToolAnswer:
    tool_input = ToolInput(
        spec_hash=fix.spec_hash,
        candidate_hash=fix.candidate_hash,
        candidate_name=fix.candidate_name,
        call=call,
        evidence=fix.evidence,
    )
    try:
        return await workflow.execute_activity(
            "run_tool", tool_input, result_type=ToolAnswer, **{**TOOL_OPTIONS, **routing}
        )
    except ActivityError as err:  # the experiment itself broke: the model hears why
        return ToolAnswer.to(call, f"error: the tool failed: {err.cause or err}")
