"""The tool-using agent's model path: answers bounded by the token budget, no experiment once it
is spent, one answer instruction, case names in both forms, one grid line, and the per-round
counts of the repair's result. Scripted endpoint, real openai client, real Temporal, PostgreSQL
and sandboxed experiments."""

from __future__ import annotations

import re

from fake_openai import FakeOpenAI, answer, call, tool_answer, tools_unsupported
from sessions import run_session
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from activities.fixers.openai_fixer import answer_instruction
from conftest import OPS
from workflows.loop import Guards
from workflows.repair import RepairWorkflow

SOFTMAX = OPS / "softmax_rows"
CEIL_GRID = (
    "<<<<<<< SEARCH\n        grid=(rows // BLOCK_R,),\n=======\n"
    "        grid=(pl.cdiv(rows, BLOCK_R),),\n>>>>>>> REPLACE\n"
)
SPEC, FLOOR_GRID = SOFTMAX / "spec.py", SOFTMAX / "variants" / "floor_grid.py"


def tool_events(events) -> list[dict]:
    return [e.payload for e in events if e.type == "ToolCalled"]


def tool_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def grid_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("grid: ")]


def knowledge_section(user: str) -> list[str]:
    section = user.split("## Knowledge from earlier repairs", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.strip()]


async def test_a_round_bounds_each_answer_and_reports_what_it_sent(client, seeded_store):
    budget = 15_000
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(call("run_case", {"case": "extended/ragged"}), prompt_tokens=3000),
            tool_answer(call("error_map", {"case": "ragged"}), prompt_tokens=3500),
            tool_answer(
                call("propose_edit", {"summary": "round the grid up", "edit": CEIL_GRID}),
                prompt_tokens=4000,
            ),
        )
        result, events, progress, _ = await run_session(
            client, seeded_store, fake, SPEC, FLOOR_GRID, guards=Guards(token_budget=budget)
        )
        requests = fake.requests
    assert result.certified and result.rounds == 1, result

    # Every request bounds the answer by what is left of the budget, its prompt counted.
    limits = [r.get("max_tokens") for r in requests]
    assert all(isinstance(n, int) and n > 0 for n in limits), limits
    assert limits[0] > limits[1] > limits[2], limits
    left = budget
    for request, spent in zip(requests, (3020, 3520, 4020), strict=True):
        assert request["max_tokens"] < left  # the prompt's estimate is taken off
        left -= spent

    # One instruction on how to answer, in both messages: call propose_edit.
    system, user = (m["content"] for m in requests[0]["messages"][:2])
    tools, text = answer_instruction("tools"), answer_instruction("text")
    assert tools in system and tools in user
    assert text not in system and text not in user
    # Knowledge reads as guidance: bullets of entries, never lines of a diff.
    knowledge = knowledge_section(user)
    assert knowledge and all(line.startswith("- [") for line in knowledge), knowledge

    # Both case names ran; both tools show the grid with one and the same line.
    calls = tool_events(events)
    assert [(c["tool"], c["ran"], c["ok"]) for c in calls] == [
        ("run_case", True, True),
        ("error_map", True, True),
    ]
    assert calls[0]["summary"].startswith("case extended/ragged R=45")
    run_case, error_map = tool_messages(requests[2])
    assert error_map.startswith("case extended/ragged R=45")
    assert grid_lines(run_case) == grid_lines(error_map)
    assert len(grid_lines(run_case)) == 1 and "(5,) = 5 programs" in grid_lines(run_case)[0]

    # The result counts what the endpoint saw and the experiments that ran, with their time.
    (stats,) = result.round_stats
    assert stats.round == 1 and stats.model_requests == len(requests) == 3
    assert stats.tool_calls == sum(c["ran"] for c in calls) == progress.tool_calls == 2
    assert stats.model_s > 0 and stats.tool_s > 0

    history = await client.get_workflow_handle(result.session_id).fetch_history()
    replayer = Replayer(workflows=[RepairWorkflow], data_converter=pydantic_data_converter)
    assert (await replayer.replay_workflow(history)).replay_failure is None


async def test_no_experiment_runs_once_a_reply_spends_the_budget(client, seeded_store):
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(
                call("run_case", {"case": "ragged"}), prompt_tokens=1200, completion_tokens=40
            ),
        )
        result, events, progress, _ = await run_session(
            client, seeded_store, fake, SPEC, FLOOR_GRID, guards=Guards(token_budget=1000)
        )
        requests = fake.requests
    assert len(requests) == 1 and 0 < requests[0]["max_tokens"] <= 1000
    (called,) = tool_events(events)
    assert (called["tool"], called["ran"], called["data_hash"]) == ("run_case", False, "")
    assert called["summary"] == "not run: the token budget is spent"
    assert progress.tool_calls == 0
    fix = next(e.payload for e in events if e.type == "FixProposed")
    assert fix["reason"] == "budget spent: 1,240 of 1,000 tokens" and fix["tool_calls"] == 0
    assert not result.certified and result.stop_reason == "token_budget"
    (stats,) = result.round_stats
    assert (stats.model_requests, stats.tool_calls, stats.tool_s) == (1, 0, 0.0)


async def test_in_text_both_messages_ask_for_the_edit_as_text(client, seeded_store):
    with FakeOpenAI() as fake:
        fake.script(tools_unsupported(), answer(f"Round the grid up.\n{CEIL_GRID}"))
        result, *_ = await run_session(client, seeded_store, fake, SPEC, FLOOR_GRID)
        requests = fake.requests
    assert result.certified
    tools, text = answer_instruction("tools"), answer_instruction("text")
    system, user = (m["content"] for m in requests[1]["messages"][:2])
    assert "TOOL <name>" in system
    assert text in system and text in user
    assert not re.search("propose_edit", system + user)
    assert tools in requests[0]["messages"][0]["content"]
    # The refused request is one the endpoint saw, and is counted.
    assert [s.model_requests for s in result.round_stats] == [len(requests)] == [2]
