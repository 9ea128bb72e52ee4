"""The tool-using fix agent: a round is model turns and experiments, each its own activity.

The workflow drives the round (``workflows.agent_round.run_agent_round``): ``agent_step`` asks
the model, with the conversation so far (kept as a blob, so history holds only its hash), and
returns the tool calls to run or the round's outcome; each call runs as a ``run_tool`` activity
and is recorded as a ToolCalled event; the answers go into the next ``agent_step``. A worker
that dies mid-round loses nothing: finished steps and tool calls are in the workflow's history
and are not run again.

Endpoints without tool calling get a plain-text protocol instead (``TOOL name {json}`` lines),
switched to on the first refusal of ``tools``. A model that answers without calling tools is
answered as before: its text is the edit. The conversation never grows without bound: beyond
``CONVERSATION_BUDGET_CHARS`` the earlier tool results are cut to their first lines.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel
from temporalio import activity

from activities import prompts
from activities.fixers.base import FixerError, to_activity_error
from activities.fixers.edits import EditError, apply_answer, summary_line
from activities.fixers.openai_fixer import (
    Requests,
    answer_instruction,
    build_messages,
    complete,
    output_limit,
    prompt_text,
)
from kb.events import EventStore
from kb.knowledge import KnowledgeProjection, search
from nearmiss.engine.runner.sandbox import Limits
from nearmiss.engine.tools import TOOL_SCHEMAS, run_tool
from nearmiss.engine.tools.text import clip
from workflows.models import (
    AgentStep,
    AgentStepInput,
    FixInput,
    FixOutcome,
    FixRequest,
    ToolAnswer,
    ToolCall,
    ToolInput,
)

CONVERSATION_BUDGET_CHARS = 60_000
ANSWER_CHARS = 2_000  # of one tool result, as the model reads it
SUMMARISED_CHARS = 300  # what is left of an earlier tool result once the budget is exceeded
KB_HITS = 5

_TEXT_CALL = re.compile(r"^[ \t]*TOOL[ \t]+([A-Za-z_]\w*)[ \t]*(.*)$", re.M)

KB_SEARCH = {
    "type": "function",
    "function": {
        "name": "kb_search",
        "description": "Search the knowledge base of earlier repairs (bug patterns and fixes) "
        "by words of an error or diagnosis; optionally one failure class.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "words to match"},
                "failure_class": {"type": "string", "description": "only this class"},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}
PROPOSE_EDIT: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "propose_edit",
        "description": "End the round with your edit: SEARCH/REPLACE blocks against the current "
        "file (or a whole new file in one python fence), and one line saying what it fixes.",
        "parameters": {
            "type": "object",
            "properties": {
                "summary": {"type": "string", "description": "what is wrong, what changes"},
                "edit": {"type": "string", "description": "SEARCH/REPLACE blocks"},
            },
            "required": ["summary", "edit"],
            "additionalProperties": False,
        },
    },
}


def tool_schemas() -> list[dict]:
    return [*TOOL_SCHEMAS, KB_SEARCH, PROPOSE_EDIT]


def tool_names() -> set[str]:
    return {schema["function"]["name"] for schema in tool_schemas()}


class Conversation(BaseModel):
    protocol: Literal["tools", "text"] = "tools"
    messages: list[dict]


def _text_protocol_description() -> str:
    """The TOOL-line protocol; ``propose_edit`` is not among its tools: in text the edit is the
    answer itself, as the system and user messages say."""
    lines = []
    for schema in tool_schemas():
        fn = schema["function"]
        if fn["name"] == "propose_edit":
            continue
        params = fn["parameters"].get("properties", {})
        args = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in params.items())
        lines.append(f"- {fn['name']}({args}): {fn['description']}")
    return prompts.render("agent_text_protocol.md", tool_list="\n".join(lines))


def _propose_edit_line() -> str:
    return f"- `propose_edit`: {PROPOSE_EDIT['function']['description']}\n"


def first_messages(request: FixRequest, tool_budget: int) -> list[dict]:
    """The fix prompt of a plain round, answered by calling ``propose_edit`` (both messages say
    so), with the experiments the agent may run first."""
    messages = build_messages(request, "tools")
    tools = prompts.render(
        "agent_tools.md", tool_budget=tool_budget, propose_edit=_propose_edit_line()
    )
    messages[0]["content"] += "\n\n" + tools.strip()
    return messages


def switch_to_text(conversation: Conversation) -> None:
    """Answer in text from now on: both messages say the edit is the answer (no
    ``propose_edit``), and the system message explains the TOOL lines."""
    conversation.protocol = "text"
    tools, text = answer_instruction("tools"), answer_instruction("text")
    for message in conversation.messages[:2]:
        message["content"] = message["content"].replace(tools, text)
    system = conversation.messages[0]
    system["content"] = system["content"].replace(_propose_edit_line(), "")
    system["content"] += "\n\n" + _text_protocol_description().strip()


def add_answers(conversation: Conversation, answers: list[ToolAnswer], note: str) -> None:
    if conversation.protocol == "tools":
        for a in answers:
            conversation.messages.append(
                {"role": "tool", "tool_call_id": a.call_id, "content": a.content}
            )
        if note:
            conversation.messages.append({"role": "user", "content": note})
        return
    parts = [f"### {a.tool} {a.arguments}\n{a.content}" for a in answers]
    text = "Results:\n\n" + "\n\n".join(parts) if parts else ""
    text = "\n\n".join(t for t in (text, note) if t)
    conversation.messages.append({"role": "user", "content": text})


def compact(conversation: Conversation) -> None:
    """Cut earlier tool results to their first lines once the conversation is too long; the
    latest turn stays whole (it is what the model is about to act on)."""
    total = sum(len(m.get("content") or "") for m in conversation.messages)
    if total <= CONVERSATION_BUDGET_CHARS:
        return
    last_assistant = max(
        (i for i, m in enumerate(conversation.messages) if m["role"] == "assistant"), default=0
    )
    for message in conversation.messages[2:last_assistant]:
        content = message.get("content") or ""
        is_result = message["role"] == "tool" or content.startswith("Results:")
        if is_result and len(content) > SUMMARISED_CHARS:
            message["content"] = (
                content[:SUMMARISED_CHARS] + f"… (earlier result cut from {len(content)} chars)"
            )


def parse_text_calls(content: str) -> list[ToolCall]:
    return [
        ToolCall(id=f"text-{n}", name=name, arguments=args.strip() or "{}")
        for n, (name, args) in enumerate(_TEXT_CALL.findall(content or ""), start=1)
    ]


def parse_arguments(call: ToolCall) -> tuple[dict | None, str]:
    """(arguments, "") or (None, the error the model is told)."""
    if call.name not in tool_names():
        known = ", ".join(sorted(tool_names()))
        return None, f"error: unknown tool {call.name!r}; the tools are: {known}"
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return None, f"error: the arguments of {call.name} are not valid JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return None, f"error: the arguments of {call.name} must be a JSON object"
    return arguments, ""


class AgentActivities:
    def __init__(
        self,
        store: EventStore,
        fixer_factory: Callable,
        checks: asyncio.Semaphore,
        learned_patch: Callable[[FixInput, str], Awaitable[FixOutcome | None]],
        heartbeating: Callable,
    ) -> None:
        self.store = store
        self.fixer_factory = fixer_factory
        self.checks = checks  # shared with check_candidate: both run JAX children
        self.learned_patch = learned_patch
        self.heartbeating = heartbeating

    @activity.defn(name="agent_step")
    async def agent_step(self, request: AgentStepInput) -> AgentStep:
        fix = request.fix
        source = (await self.store.get_blob(fix.candidate_hash)).decode()
        if not request.conversation_hash:
            patched = await self.learned_patch(fix, source)
            if patched is not None:  # zero tokens first, as in a plain round
                return AgentStep(conversation_hash="", outcome=patched)
            spec = (await self.store.get_blob(fix.spec_hash)).decode()
            fix_request = FixRequest.of(fix, spec, source)
            conversation = Conversation(messages=first_messages(fix_request, request.tool_budget))
        else:
            blob = await self.store.get_blob(request.conversation_hash)
            conversation = Conversation.model_validate_json(blob)
            add_answers(conversation, request.answers, request.note)
        compact(conversation)
        fixer = self.fixer_factory(fix.model)
        sent = Requests()
        try:
            completion, tokens = await self.heartbeating(
                self._ask(fixer, conversation, request.tools_allowed, request.tokens_left, sent)
            )
        except FixerError as exc:
            raise to_activity_error(exc) from exc
        finally:
            if hasattr(fixer, "aclose"):
                await fixer.aclose()
        step, edited = self._read_turn(conversation, completion, source, request.tools_allowed)
        step.tokens = tokens
        step.model_requests, step.model_s = sent.sent, round(sent.seconds, 3)
        step.conversation_hash = await self.store.put_blob(conversation.model_dump_json().encode())
        if step.outcome is not None:
            step.outcome.model = fix.model
            if edited is not None:
                step.outcome.candidate_hash = await self.store.put_blob(edited.encode())
            step.outcome.prompt_hash = await self.store.put_blob(
                prompt_text(conversation.messages[:-1]).encode()
            )
            answer = conversation.messages[-1]
            response = json.dumps(answer) if answer.get("tool_calls") else answer["content"]
            step.outcome.response_hash = await self.store.put_blob((response or "").encode())
        return step

    async def _ask(
        self,
        fixer,
        conversation: Conversation,
        tools_allowed: bool,
        tokens_left: int | None,
        sent: Requests,
    ):
        params: dict = {"temperature": 0}
        if conversation.protocol == "tools":
            params["tools"] = tool_schemas()
            params["tool_choice"] = "auto" if tools_allowed else "none"
        try:
            completion, tokens, _, _ = await complete(
                fixer.client,
                fixer.model,
                conversation.messages,
                max_output=output_limit(tokens_left, conversation.messages),
                requests=sent,
                **params,
            )
        except FixerError as exc:
            refused_tools = not exc.retryable and "tool" in str(exc).lower()
            if conversation.protocol == "tools" and refused_tools:
                switch_to_text(conversation)  # an endpoint without tool calling
                return await self._ask(fixer, conversation, tools_allowed, tokens_left, sent)
            raise
        return completion, tokens

    def _read_turn(
        self, conversation: Conversation, completion, source: str, tools_allowed: bool
    ) -> tuple[AgentStep, str | None]:
        """The step this turn makes, and the edited source when it ends the round with one."""
        message = completion.choices[0].message
        content = message.content or ""
        if conversation.protocol == "tools":
            calls = [
                ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
                for c in (message.tool_calls or [])
            ]
            turn: dict = {"role": "assistant", "content": content}
            if calls:
                turn["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ]
        else:
            calls = parse_text_calls(content)
            turn = {"role": "assistant", "content": content}
        conversation.messages.append(turn)
        if not calls:  # a plain answer: its text is the edit, as in a round without tools
            outcome, edited = _edit_outcome(source, content, None)
            return AgentStep(conversation_hash="", outcome=outcome), edited
        return _dispatch(calls, source, tools_allowed)

    @activity.defn(name="run_tool")
    async def run_tool(self, request: ToolInput) -> ToolAnswer:
        call = request.call
        arguments = json.loads(call.arguments or "{}")  # agent_step let only valid ones through
        started = time.monotonic()
        if call.name == "kb_search":
            ok, content, data = await self._kb_search(arguments, request)
        else:
            work = self._engine_tool(call.name, arguments, request)
            ok, content, data = await self.heartbeating(work)
        answer = ToolAnswer.to(call, clip(content, ANSWER_CHARS), ok=ok)
        answer.seconds = round(time.monotonic() - started, 3)
        answer.data_hash = await self.store.put_blob(json.dumps(data, default=str).encode())
        return answer

    async def _engine_tool(self, name: str, arguments: dict, request: ToolInput):
        files = self.store.checkout(
            request.spec_hash, request.candidate_hash, request.candidate_name, "tool"
        )
        async with self.checks, files as (spec_path, candidate_path):
            result = await asyncio.to_thread(
                run_tool,
                name,
                arguments,
                spec_path=spec_path,
                candidate_path=candidate_path,
                limits=Limits(),
            )
        return result.ok, result.summary, result.data

    async def _kb_search(self, arguments: dict, request: ToolInput):
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return False, "error: kb_search needs a non-empty string `query`", {}
        projection = KnowledgeProjection(self.store)
        await projection.catch_up()
        category = request.evidence.category if request.evidence else None
        hits = search(
            await projection.entries(), query, arguments.get("failure_class"), category, KB_HITS
        )
        if not hits:
            return True, "no matching entries", {"entry_ids": []}
        text = "\n".join(clip(e.line(), 400) for e in hits)
        return True, text, {"entry_ids": [e.id for e in hits]}


def _edit_outcome(source: str, answer: str, summary: str | None) -> tuple[FixOutcome, str | None]:
    """The round's outcome from an edit answer and the edited source; without a usable edit,
    the reason (and None)."""
    try:
        edited = apply_answer(source, answer)
    except EditError as exc:
        return FixOutcome(reason=exc.reason), None
    return FixOutcome(summary=summary or summary_line(answer)), edited


def _dispatch(
    calls: list[ToolCall], source: str, tools_allowed: bool
) -> tuple[AgentStep, str | None]:
    """Which calls to run, which to answer at once, or the outcome (an applied propose_edit)."""
    step = AgentStep(conversation_hash="")
    edit_failed = False
    for call in calls:
        if call.name != "propose_edit":
            continue
        arguments, error = parse_arguments(call)
        if arguments is None or not isinstance(arguments.get("edit"), str):
            step.answered.append(ToolAnswer.to(call, error or "error: propose_edit needs `edit`"))
            edit_failed = True
            continue
        outcome, edited = _edit_outcome(source, arguments["edit"], arguments.get("summary"))
        if edited is not None:
            step.outcome = outcome
            return step, edited
        step.answered.append(
            ToolAnswer.to(call, f"error: the edit did not apply: {outcome.reason}")
        )
        edit_failed = True
    for call in calls:
        if call.name == "propose_edit":
            continue
        if not tools_allowed:
            step.answered.append(ToolAnswer.to(call, "not run: the tool budget is spent"))
            continue
        arguments, error = parse_arguments(call)
        if arguments is None:
            step.answered.append(ToolAnswer.to(call, error))
        else:
            step.calls.append(call)
    if not tools_allowed and not edit_failed:
        # Told to edit, it called tools again: the round ends rather than loop.
        step.outcome = FixOutcome(reason="the model kept calling tools after its budget was spent")
    return step, None
