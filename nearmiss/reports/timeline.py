"""One repair event in words, for a report's timeline.

Every event type of a repair stream has a sentence; a type this module does not know (a newer
writer's) still gets a row with its payload, so a report never hides part of a session.
"""

from __future__ import annotations

import json
from typing import Any

from nearmiss.engine.models import CheckReport
from nearmiss.events import (
    CandidateValidated,
    EvidenceCollected,
    FixProposed,
    GuardTripped,
    IntegrityViolated,
    InvalidEvent,
    KnowledgeRetrieved,
    RepairFinished,
    RepairStarted,
    ToolCalled,
    parse,
)
from workflows.models import TokenUsage

MAX_JSON_CHARS = 300


TOOL_ARGUMENT_CHARS = 120
TOOL_ANSWER_CHARS = 300


def short_hash(digest: str | None) -> str:
    """'sha256:0123abcd…' → '0123abcd' (what a reader needs to tell candidates apart)."""
    return (digest or "").split(":")[-1][:8] or "-"


def describe_tokens(tokens: TokenUsage | dict | None) -> str:
    """'1000 input (600 cached), 300 output' — of a session, a round, or an event's payload."""
    t = TokenUsage.model_validate(tokens or {})
    return f"{t.input} input ({t.cached_input} cached), {t.output} output"


def compact_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= MAX_JSON_CHARS else text[: MAX_JSON_CHARS - 1] + "…"


def _cases(report: CheckReport | None) -> str:
    if report is None:
        return ""
    passed = sum(c.passed for c in report.cases)
    failing = [f"{c.suite}/{c.name} ({c.failure_class})" for c in report.cases if not c.passed]
    text = f"; cases {passed}/{len(report.cases)} passed"
    return text + (f", failing {', '.join(failing)}" if failing else "")


def _evidence(e: EvidenceCollected, report: CheckReport | None) -> str:
    verdict = "certified" if e.certified else e.failure_class or "no failure class"
    text = (
        f"{e.phase} of {short_hash(e.candidate_hash)} "
        f"(suite {e.suite}): {verdict}, score {e.score:.3f}"
    )
    if e.trimmed_from:  # the candidate proposed, with the changes it did not need put back
        text += f" (trimmed from {short_hash(e.trimmed_from)}: {'; '.join(e.trimmed)})"
    return text + _cases(report)


def _knowledge(e: KnowledgeRetrieved) -> str:
    if not e.entry_ids and not e.patches:
        return "no knowledge matched"
    text = f"knowledge used: {', '.join(e.entry_ids) or 'none'}"
    return text + (f"; learned patches: {', '.join(e.patches)}" if e.patches else "")


def _fix(e: FixProposed) -> str:
    model = e.model or "the fixer"
    if not e.candidate_hash:
        return f"{model} proposed no edit: {e.reason or 'no reason given'}"
    text = f"{model} proposed {short_hash(e.candidate_hash)}: {e.summary or '-'}"
    return text + f" · tokens {describe_tokens(e.tokens)}"


def _finished(e: RepairFinished) -> str:
    verdict = "CERTIFIED" if e.certified else "NOT CERTIFIED"
    return (
        f"{verdict} after {e.rounds} round(s): {e.stop_reason}: "
        f"{e.stop_detail} · tokens {describe_tokens(e.tokens)}"
    )


def _tool_called(e: ToolCalled) -> str:
    """An experiment of the agent: the call (arguments cut short: a probe is a whole file) and
    the gist of what it answered."""
    arguments = " ".join(e.arguments.split())
    if len(arguments) > TOOL_ARGUMENT_CHARS:
        arguments = arguments[:TOOL_ARGUMENT_CHARS] + "…"
    answer = " ".join((e.summary or "-").split())
    if len(answer) > TOOL_ANSWER_CHARS:
        answer = answer[:TOOL_ANSWER_CHARS] + "…"
    state = "" if e.ran else " (not run)"
    return f"experiment {e.tool}({arguments}){state} → {answer}"


def _started(e: RepairStarted) -> str:
    guards = ", ".join(f"{k} {v}" for k, v in e.guards.items())
    return (
        f"repair of {e.kernel} ({e.candidate_name}) with {e.model}"
        + ("" if e.use_kb else ", no knowledge base")
        + (f"; guards: {guards}" if guards else "")
    )


def describe_event(kind: str, p: dict, report: CheckReport | None = None) -> str:
    """The event in one sentence; ``report`` is an EvidenceCollected's CheckReport, if loaded."""
    try:
        event = parse(kind, p)
    except InvalidEvent:  # a newer writer's event, or one this code cannot read: its payload
        return compact_json(p)
    match event:
        case RepairStarted():
            return _started(event)
        case EvidenceCollected():
            return _evidence(event, report)
        case KnowledgeRetrieved():
            return _knowledge(event)
        case FixProposed():
            return _fix(event)
        case CandidateValidated():
            return (
                f"candidate {short_hash(event.candidate_hash)} validated: {event.outcome}, "
                f"score {event.score:.3f}; best is {short_hash(event.best_hash)}"
            )
        case IntegrityViolated():
            found = "; ".join(f"{v.get('rule')}: {v.get('detail')}" for v in event.violations)
            return f"integrity violated by {short_hash(event.candidate_hash)}: {found}"
        case GuardTripped():
            return f"guard {event.guard} tripped: {event.detail}"
        case RepairFinished():
            return _finished(event)
        case ToolCalled():
            return _tool_called(event)
    return compact_json(p)
