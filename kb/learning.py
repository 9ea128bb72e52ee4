"""Quality-gated learning: a certified repair becomes a knowledge entry, nothing else does.

``learn_from_session`` reads one session's events. It learns only when the session finished
certified, the final candidate's certification ran the full suite (compact + extended) and
passed, and no integrity violation was ever recorded against that candidate; and only when the
fix changed something. The entry's signature is the failure the original candidate showed, its
payload the minimal diff. The same diff learned from another, independent session (a different
original kernel) confirms it; ``PROMOTE_AFTER`` confirmations promote it into prompts. Until then
it is a candidate — which the zero-token step may still try, since the engine validates anyway.
"""

from __future__ import annotations

import hashlib
import json
import re

from kb.events import EventLog, NewEvent
from kb.patches import make_diff

PROMOTE_AFTER = 2  # distinct original kernels fixed by the same diff


class Refused(Exception):
    """Why a session taught nothing."""


def _last(events, kind: str, **match):
    found = [
        e for e in events if e.type == kind and all(e.payload.get(k) == v for k, v in match.items())
    ]
    return found[-1] if found else None


async def _distil(store: EventLog, session_id: str) -> tuple[dict, str]:
    events = await store.read_stream(session_id)
    started, finished = _last(events, "RepairStarted"), _last(events, "RepairFinished")
    if started is None or finished is None:
        raise Refused("the session has not finished")
    if not finished.payload.get("certified"):
        raise Refused("the session did not certify")
    original, final = started.payload["candidate_hash"], finished.payload["final_hash"]
    if original == final:
        raise Refused("the original was already right: no fix to learn")
    certify = _last(events, "EvidenceCollected", phase="certify", candidate_hash=final)
    if certify is None or not certify.payload["certified"] or certify.payload["suite"] != "all":
        raise Refused("the final candidate was not certified on the full suite")
    if any(
        e.type == "IntegrityViolated" and e.payload.get("candidate_hash") == final for e in events
    ):
        raise Refused("an integrity violation was recorded against the final candidate")
    failed = [
        e.payload
        for e in events
        if e.type == "EvidenceCollected"
        and e.payload["candidate_hash"] == original
        and not e.payload["certified"]
    ]
    if not failed:
        raise Refused("no failure of the original candidate was recorded")
    first = failed[-1]  # the most informative: certify's evidence when compact passed
    before = (await store.get_blob(original)).decode()
    after = (await store.get_blob(final)).decode()
    diff = make_diff(before, after)
    diagnosis = ""
    if first.get("report_hash"):
        report = json.loads(await store.get_blob(first["report_hash"]))
        diagnosis = report.get("diagnosis", "")[:300]
    fixes = [e.payload for e in events if e.type == "FixProposed" and e.payload.get("summary")]
    changed = next((line[1:].strip() for line in diff.splitlines() if line.startswith("+ ")), "")
    digest = hashlib.sha256(
        "\n".join(line.strip() for line in diff.splitlines() if line[:1] in "+-").encode()
    ).hexdigest()[:12]
    entry = {
        "id": f"learned-{digest}",
        "title": f"Learned fix for {first['failure_class']} in {first.get('category') or 'any'}: "
        f"{changed[:60]}",
        "signature": {
            "failure_class": first["failure_class"],
            "category": first.get("category") or "any",
            "platform": first.get("platform") or "any",
        },
        "bug_family": "learned",
        "diagnosis": diagnosis,
        "guidance": fixes[-1]["summary"][:300] if fixes else "apply the diff",
        "example": diff[:400],
        "keywords": sorted(set(re.findall(r"[A-Za-z_]{4,}", diagnosis)))[:20],
        "diff": diff,
    }
    return entry, original


async def learn_from_session(store: EventLog, session_id: str) -> str:
    """Learn from one session; returns what happened in words (never raises for a refusal)."""
    try:
        entry, original = await _distil(store, session_id)
    except Refused as why:
        return f"nothing learned: {why}"
    stream = f"kb-{entry['id']}"
    history = await store.read_stream(stream)
    origins = {e.payload.get("original_hash") for e in history}
    sessions = {e.payload.get("session_id") for e in history}
    if session_id in sessions:
        return f"already learned {entry['id']} from this session"
    if not history:
        payload = {"entry": entry, "source": "learned", "status": "candidate"}
        payload |= {"session_id": session_id, "original_hash": original}
        await store.append(stream, 0, [NewEvent("KnowledgeAdded", payload)])
        return f"learned {entry['id']} (candidate)"
    confirmed = {"session_id": session_id, "original_hash": original}
    events = [NewEvent("KnowledgeConfirmed", confirmed)]
    independent = origins | {original}
    promoted = any(e.type == "KnowledgePromoted" for e in history)
    if len(independent) >= PROMOTE_AFTER and not promoted:
        events.append(NewEvent("KnowledgePromoted", {"confirmations": len(independent)}))
    await store.append(stream, len(history), events)
    return f"confirmed {entry['id']}" + (" and promoted it" if len(events) > 1 else "")
