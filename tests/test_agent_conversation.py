"""The agent's conversation bookkeeping, without a server: bounded growth, the text protocol."""

from __future__ import annotations

from activities.agent import (
    CONVERSATION_BUDGET_CHARS,
    SUMMARISED_CHARS,
    Conversation,
    add_answers,
    compact,
    parse_arguments,
    parse_text_calls,
)
from workflows.models import ToolAnswer, ToolCall


def _long_round(turns: int, result_chars: int) -> Conversation:
    conversation = Conversation(
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    )
    for n in range(turns):
        conversation.messages.append(
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}"}]}
        )
        answer = ToolAnswer(call_id=f"c{n}", tool="run_case", content=f"{n}:" + "x" * result_chars)
        add_answers(conversation, [answer], note="")
    return conversation


def test_a_long_round_keeps_its_latest_result_whole_and_cuts_the_earlier_ones():
    conversation = _long_round(turns=12, result_chars=8000)
    assert sum(len(m["content"]) for m in conversation.messages) > CONVERSATION_BUDGET_CHARS
    compact(conversation)
    tool_messages = [m["content"] for m in conversation.messages if m["role"] == "tool"]
    assert tool_messages[-1] == "11:" + "x" * 8000  # what the model acts on next stays whole
    assert all(len(t) < SUMMARISED_CHARS + 60 for t in tool_messages[:-1])
    assert tool_messages[0].startswith("0:xxx") and "cut from 8002 chars" in tool_messages[0]
    assert sum(len(m["content"]) for m in conversation.messages) < CONVERSATION_BUDGET_CHARS


def test_a_short_round_is_left_alone():
    conversation = _long_round(turns=3, result_chars=100)
    before = conversation.model_dump()
    compact(conversation)
    assert conversation.model_dump() == before


def test_text_protocol_calls_are_read_line_by_line():
    calls = parse_text_calls(
        'I will look.\nTOOL run_case {"case": "ragged"}\n  TOOL error_map\nnot TOOL x {}'
    )
    assert [(c.name, c.arguments) for c in calls] == [
        ("run_case", '{"case": "ragged"}'),
        ("error_map", "{}"),
    ]


def test_bad_arguments_become_messages_for_the_model():
    assert parse_arguments(ToolCall(id="1", name="run_case", arguments="[1]"))[1].endswith(
        "must be a JSON object"
    )
    arguments, error = parse_arguments(ToolCall(id="2", name="probe", arguments='{"a": 1}'))
    assert arguments == {"a": 1} and error == ""  # the tool itself names missing arguments
