"""Quality-gated learning: a certified repair becomes a knowledge entry, nothing else does.

``learn_from_session`` reads one session's events. It learns only when the session finished
certified, the final candidate's certification ran the full suite (compact + extended) and
passed, and no integrity violation was ever recorded against that candidate; and only when the
fix changed something (``certified_fix``, the gate). The entry's signature is the failure the
original candidate showed, its payload the minimal diff. The same diff learned from another,
independent session confirms it; ``PROMOTE_AFTER`` independent teachers promote it into
prompts. Until then it is a candidate — which the zero-token step may still try, since the
engine validates anyway.

Independence has two sides, and a teacher must be new on both:

- **The kernel** (``source_shape``): its syntax tree with comments, docstrings, formatting and
  the names it chooses taken out. One kernel with a comment changed, renamed or reformatted is
  the same kernel, so one author (or one hostile proposal) cannot promote an entry by
  re-submitting it; sessions recorded before shapes count by their original's hash.
- **The fleet** (``fleet_of``): the sessions of one fleet were submitted together, by one
  person, with one model and one set of guards, and are often generated variants of one
  kernel; a shape check cannot see that, so a fleet is one teacher however many of its members
  fix the same line. A session outside a fleet is a fleet of its own.

``independent`` counts the teachers that can be picked so that no two share a kernel shape or
a fleet (the largest matching between fleets and shapes). So three members of one fleet on
three different kernels count once, as do three fleets on one kernel; one fleet on kernels A
and B plus another session on A count twice (the fleet for B, the other for A). The same count
ranks negative knowledge (kb.knowledge.failed_attempts).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Iterator

from kb.events import EventLog, NewEvent, StoredEvent
from kb.patches import make_diff
from nearmiss.events import (
    E,
    EvidenceCollected,
    FixProposed,
    IntegrityViolated,
    KnowledgeAdded,
    KnowledgeConfirmed,
    KnowledgePromoted,
    RepairFinished,
    RepairStarted,
    of_type,
)

PROMOTE_AFTER = 2  # independent teachers (``independent``) of the same diff
# A fleet member's session id (workflows.fleet.member_session_id): the fleet's id, a dot, the
# member's index in five or more digits, a dash and the kernel. The first such mark: an index
# mark inside a kernel's name then never makes members of one fleet look like several.
_FLEET_MEMBER = re.compile(r"(.+?)\.\d{5,}-")


class Refused(Exception):
    """Why a session taught nothing."""


def _last(found: list[E]) -> E | None:
    return found[-1] if found else None


def certified_fix(
    events: Iterable[StoredEvent],
) -> tuple[RepairStarted, RepairFinished, list[EvidenceCollected]]:
    """The gate: (how the session started, how it finished, the failed checks of its original)
    for a session that ended in a real, certified fix; raises Refused, saying why, for any
    other. kb.knowledge reads it too: a failed attempt beside such a fix was a real wrong turn.
    """
    events = list(events)
    started = _last(of_type(events, RepairStarted))
    finished = _last(of_type(events, RepairFinished))
    if started is None or finished is None:
        raise Refused("the session has not finished")
    if not finished.certified:
        raise Refused("the session did not certify")
    original, final = started.candidate_hash, finished.final_hash
    if original == final:
        raise Refused("the original was already right: no fix to learn")
    checks = of_type(events, EvidenceCollected)
    certify = _last([e for e in checks if e.phase == "certify" and e.candidate_hash == final])
    if certify is None or not certify.certified or certify.suite != "all":
        raise Refused("the final candidate was not certified on the full suite")
    if any(v.candidate_hash == final for v in of_type(events, IntegrityViolated)):
        raise Refused("an integrity violation was recorded against the final candidate")
    failed = [e for e in checks if e.candidate_hash == original and not e.certified]
    if not failed:
        raise Refused("no failure of the original candidate was recorded")
    return started, finished, failed


async def _distil(store: EventLog, session_id: str) -> tuple[dict, str, str]:
    events = await store.read_stream(session_id)
    started, finished, failed = certified_fix(events)
    original, final = started.candidate_hash, finished.final_hash
    fixes = [f for f in of_type(events, FixProposed) if f.summary]
    first = failed[-1]  # the most informative: certify's evidence when compact passed
    before = (await store.get_blob(original)).decode()
    after = (await store.get_blob(final)).decode()
    diff = make_diff(before, after)
    diagnosis = ""
    if first.report_hash:
        report = json.loads(await store.get_blob(first.report_hash))
        diagnosis = report.get("diagnosis", "")[:300]
    changed = next((line[1:].strip() for line in diff.splitlines() if line.startswith("+ ")), "")
    digest = hashlib.sha256(
        "\n".join(line.strip() for line in diff.splitlines() if line[:1] in "+-").encode()
    ).hexdigest()[:12]
    entry = {
        "id": f"learned-{digest}",
        "title": f"Learned fix for {first.failure_class} in {first.category or 'any'}: "
        f"{changed[:60]}",
        "signature": {
            "failure_class": first.failure_class,
            "category": first.category or "any",
            "platform": first.platform or "any",
        },
        "bug_family": "learned",
        "diagnosis": diagnosis,
        "guidance": fixes[-1].summary[:300] if fixes else "apply the diff",
        "example": diff[:400],
        "keywords": sorted(set(re.findall(r"[A-Za-z_]{4,}", diagnosis)))[:20],
        "diff": diff,
    }
    return entry, original, source_shape(before)


def source_shape(source: str) -> str:
    """A digest of ``source`` that comments, docstrings, formatting and the names it chooses
    for its variables, arguments, functions and classes do not change (each is numbered by
    first appearance); the text's own digest where it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return hashlib.sha256(source.encode()).hexdigest()[:16]
    names: dict[str, str] = {}

    def numbered(name: str) -> str:
        return names.setdefault(name, f"n{len(names)}")

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            del body[0]  # a docstring
        if isinstance(node, ast.Name):
            node.id = numbered(node.id)
        elif isinstance(node, ast.arg):
            node.arg = numbered(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            node.name = numbered(node.name)
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def fleet_of(session_id: str) -> str:
    """The fleet a session ran in (its id's part before the member mark), or the session
    itself where it ran alone."""
    member = _FLEET_MEMBER.match(session_id)
    return member.group(1) if member else session_id


def independent(pairs: Iterable[tuple[str, str]]) -> int:
    """How many of these (fleet, kernel shape) pairs can be picked with no two sharing a fleet
    or a shape: a maximum matching between fleets and shapes (augmenting paths, walked without
    recursion however long they get). Repeats count once."""
    shapes_of: dict[str, set[str]] = {}
    for fleet, shape in pairs:
        shapes_of.setdefault(fleet, set()).add(shape)
    holder: dict[str, str] = {}  # shape -> the fleet picked with it
    return sum(_augment(fleet, shapes_of, holder) for fleet in sorted(shapes_of))


def _augment(start: str, shapes_of: dict[str, set[str]], holder: dict[str, str]) -> bool:
    """Give ``start`` a shape, moving fleets already picked to other shapes of theirs where
    that frees one; whether it got one."""
    seen: set[str] = set()
    stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(shapes_of[start])))]
    path: list[tuple[str, str]] = []  # (fleet, the taken shape it would take over)
    while stack:
        fleet, options = stack[-1]
        for shape in options:
            if shape in seen:
                continue
            seen.add(shape)
            taken_by = holder.get(shape)
            if taken_by is None:
                holder[shape] = fleet
                for earlier, its_shape in path:
                    holder[its_shape] = earlier
                return True
            path.append((fleet, shape))
            stack.append((taken_by, iter(sorted(shapes_of[taken_by]))))
            break
        else:
            stack.pop()
            if path:
                path.pop()
    return False


def teacher_pairs(history: list[StoredEvent]) -> set[tuple[str, str]]:
    """(fleet, kernel shape) of each session that taught a learned entry."""
    return {
        (fleet_of(e.session_id), e.original_shape or e.original_hash) for e in teachers(history)
    }


def teachers(history: list[StoredEvent]) -> list[KnowledgeAdded | KnowledgeConfirmed]:
    """The sessions that taught a learned entry, from its stream: the one that added it and
    those that confirmed it (a seed entry has none)."""
    found: list[KnowledgeAdded | KnowledgeConfirmed] = [
        *of_type(history, KnowledgeAdded),
        *of_type(history, KnowledgeConfirmed),
    ]
    return [e for e in found if e.session_id]


async def learn_from_session(store: EventLog, session_id: str) -> str:
    """Learn from one session; returns what happened in words (never raises for a refusal)."""
    try:
        entry, original, shape = await _distil(store, session_id)
    except Refused as why:
        return f"nothing learned: {why}"
    stream = f"kb-{entry['id']}"
    history = await store.read_stream(stream)
    sessions = {e.session_id for e in teachers(history)}
    if session_id in sessions:
        return f"already learned {entry['id']} from this session"
    if not history:
        added = KnowledgeAdded(
            entry=entry,
            source="learned",
            status="candidate",
            session_id=session_id,
            original_hash=original,
            original_shape=shape,
        )
        await store.append(stream, 0, [NewEvent.of(added)])
        return f"learned {entry['id']} (candidate)"
    confirmed = KnowledgeConfirmed(
        session_id=session_id, original_hash=original, original_shape=shape
    )
    events = [NewEvent.of(confirmed)]
    count = independent(teacher_pairs(history) | {(fleet_of(session_id), shape)})
    promoted = any(e.type == "KnowledgePromoted" for e in history)
    if count >= PROMOTE_AFTER and not promoted:
        events.append(NewEvent.of(KnowledgePromoted(confirmations=count)))
    await store.append(stream, len(history), events)
    return f"confirmed {entry['id']}" + (" and promoted it" if len(events) > 1 else "")
