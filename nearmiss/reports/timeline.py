"""One repair event in words, for a report's timeline.

Every event type of a repair stream has a sentence; a type this module does not know (a newer
writer's) still gets a row with its payload, so a report never hides part of a session.
"""

from __future__ import annotations

import json
from typing import Any

from nearmiss.engine.models import CheckReport
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


def _evidence(p: dict, report: CheckReport | None) -> str:
    verdict = "certified" if p.get("certified") else p.get("failure_class") or "no failure class"
    text = (
        f"{p.get('phase', 'check')} of {short_hash(p.get('candidate_hash'))} "
        f"(suite {p.get('suite', '?')}): {verdict}, score {p.get('score', 0):.3f}"
    )
    return text + _cases(report)


def _knowledge(p: dict) -> str:
    entries, patches = p.get("entry_ids") or [], p.get("patches") or []
    if not entries and not patches:
        return "no knowledge matched"
    text = f"knowledge used: {', '.join(entries) or 'none'}"
    return text + (f"; learned patches: {', '.join(patches)}" if patches else "")


def _fix(p: dict) -> str:
    model = p.get("model") or "the fixer"
    if not p.get("candidate_hash"):
        return f"{model} proposed no edit: {p.get('reason') or 'no reason given'}"
    text = f"{model} proposed {short_hash(p.get('candidate_hash'))}: {p.get('summary') or '-'}"
    return text + f" · tokens {describe_tokens(p.get('tokens'))}"


def _finished(p: dict) -> str:
    verdict = "CERTIFIED" if p.get("certified") else "NOT CERTIFIED"
    return (
        f"{verdict} after {p.get('rounds', 0)} round(s): {p.get('stop_reason')}: "
        f"{p.get('stop_detail', '')} · tokens {describe_tokens(p.get('tokens'))}"
    )


def _tool_called(p: dict) -> str:
    """An experiment of the agent: the call (arguments cut short: a probe is a whole file) and
    the gist of what it answered."""
    arguments = p.get("arguments", "")
    arguments = arguments if isinstance(arguments, str) else compact_json(arguments)
    arguments = " ".join(arguments.split())
    if len(arguments) > TOOL_ARGUMENT_CHARS:
        arguments = arguments[:TOOL_ARGUMENT_CHARS] + "…"
    answer = " ".join((p.get("summary") or "-").split())
    if len(answer) > TOOL_ANSWER_CHARS:
        answer = answer[:TOOL_ANSWER_CHARS] + "…"
    state = "" if p.get("ran", True) else " (not run)"
    return f"experiment {p.get('tool')}({arguments}){state} → {answer}"


def describe_event(kind: str, p: dict, report: CheckReport | None = None) -> str:
    """The event in one sentence; ``report`` is an EvidenceCollected's CheckReport, if loaded."""
    if kind == "RepairStarted":
        guards = ", ".join(f"{k} {v}" for k, v in (p.get("guards") or {}).items())
        return (
            f"repair of {p.get('kernel')} ({p.get('candidate_name')}) with {p.get('model')}"
            + ("" if p.get("use_kb", True) else ", no knowledge base")
            + (f"; guards: {guards}" if guards else "")
        )
    if kind == "EvidenceCollected":
        return _evidence(p, report)
    if kind == "KnowledgeRetrieved":
        return _knowledge(p)
    if kind == "FixProposed":
        return _fix(p)
    if kind == "CandidateValidated":
        return (
            f"candidate {short_hash(p.get('candidate_hash'))} validated: {p.get('outcome')}, "
            f"score {p.get('score', 0):.3f}; best is {short_hash(p.get('best_hash'))}"
        )
    if kind == "IntegrityViolated":
        found = "; ".join(f"{v.get('rule')}: {v.get('detail')}" for v in p.get("violations", []))
        return f"integrity violated by {short_hash(p.get('candidate_hash'))}: {found}"
    if kind == "GuardTripped":
        return f"guard {p.get('guard')} tripped: {p.get('detail', '')}"
    if kind == "RepairFinished":
        return _finished(p)
    if kind == "ToolCalled":
        return _tool_called(p)
    return compact_json(p)
