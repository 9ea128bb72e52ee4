"""One fix round of the tool-using agent, as workflow code (deterministic, activities by name).

    agent_step ─► tool calls? ─► run_tool each (recorded as ToolCalled) ─► agent_step ─► ...
         └─► outcome (an edit, or none with its reason) ends the round

Bounded three ways: tool calls per round and per repair (the guards; calls beyond them are
answered "not run"), the session's token budget, and a cap on model turns per round. Each model
turn is told what is left of the budget (it bounds the answer's length); a turn whose tokens
spend it ends the round, and its tool calls are answered "not run". Every model turn and every
tool call is an activity, so a worker restart mid-round resumes where the history says, running
nothing twice.
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
    from workflows.patches import TOOLS_WITHIN_BUDGET, has
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
    token_budget: int | None = None,
) -> tuple[FixOutcome, float]:
    """The round's outcome, with the tokens of all its turns, the tool calls it ran and the
    model requests it made (with their time), and the time it ended (``workflow.now()``, read
    before its last recording: after a recording, a local activity, the code may run in another
    workflow task live than on a replay, see workflows.patches). ``tool_routing``: the task
    queue options of the experiments (workflows.routing). ``tokens_left``: of the repair's
    ``token_budget`` when the round starts (None: no budget)."""
    budget = max(0, min(per_round, tools_left))
    within_budget = has(TOOLS_WITHIN_BUDGET)
    step_input = AgentStepInput(
        fix=fix, tool_budget=budget, tools_allowed=budget > 0, tokens_left=tokens_left
    )
    stats = _Stats()
    ran, ended = 0, _now()
    for _turn in range(budget + EXTRA_TURNS):
        try:
            step = await workflow.execute_activity(
                "agent_step", step_input, result_type=AgentStep, **fix_options
            )
        except ActivityError as err:  # retries exhausted, or a non-retryable model error
            reason = f"the fixer failed: {err.cause or err}"
            outcome = FixOutcome(fatal=True, reason=reason, model=fix.model)
            return stats.onto(outcome, ran), _now()
        stats.add_step(step)
        tokens = stats.tokens
        answers = list(step.answered)
        events = [_called(fix.round, answer, ran=False) for answer in step.answered]
        if step.outcome is not None:
            ended = _now()
            await record(events)  # e.g. calls refused because the round had to end
            return stats.onto(step.outcome, ran), ended
        spent = tokens_left is not None and tokens.total >= tokens_left
        for call in step.calls:
            if spent and within_budget:
                answer = ToolAnswer.to(call, "not run: the token budget is spent")
                events.append(_called(fix.round, answer, ran=False))
            elif ran >= budget:
                answer = ToolAnswer.to(call, "not run: the tool budget of this round is spent")
                events.append(_called(fix.round, answer, ran=False))
            else:
                answer = await _run_tool(fix, call, tool_routing)
                ran += 1
                stats.tool_s += answer.seconds
                events.append(_called(fix.round, answer, ran=True))
            answers.append(answer)
        ended = _now()
        await record(events)
        if spent:
            assert tokens_left is not None  # spent says so
            reason = (
                _spent(tokens.total, tokens_left, token_budget)
                if within_budget
                else "the token budget ran out during the round's experiments"
            )
            return stats.onto(FixOutcome(reason=reason, model=fix.model), ran), ended
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
            tokens_left=None if tokens_left is None else tokens_left - tokens.total,
        )
    reason = f"no edit after {budget + EXTRA_TURNS} model turns"
    return stats.onto(FixOutcome(reason=reason, model=fix.model), ran), ended


class _Stats:
    """What the round spent so far: tokens, model requests and their time, tool time."""

    def __init__(self) -> None:
        self.tokens = TokenUsage()
        self.model_requests = 0
        self.model_s = 0.0
        self.tool_s = 0.0

    def add_step(self, step: AgentStep) -> None:
        self.tokens = self.tokens + step.tokens
        self.model_requests += step.model_requests
        self.model_s += step.model_s

    def onto(self, outcome: FixOutcome, ran: int) -> FixOutcome:
        return outcome.model_copy(
            update={
                "tokens": self.tokens,
                "tool_calls": ran,
                "model_requests": self.model_requests,
                "model_s": round(self.model_s, 3),
                "tool_s": round(self.tool_s, 3),
            }
        )


def _spent(round_total: int, tokens_left: int, token_budget: int | None) -> str:
    """'budget spent: 1,240 of 1,000 tokens' (the repair's, where its budget is known)."""
    if token_budget is None:
        return f"budget spent: {round_total:,} tokens this round, {tokens_left:,} were left"
    used = token_budget - tokens_left + round_total
    return f"budget spent: {used:,} of {token_budget:,} tokens"


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
