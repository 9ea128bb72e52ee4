"""The ``replay:SESSION`` fixer: a past session's recorded answers, round by round, at no cost.

Re-running a session this way asks no model: round N proposes exactly the candidate that round N
of the recording proposed (by content hash, already in the blob store). What changes between the
recording and the re-run is everything else — today's JAX, hardware, checks and forensics — which
is what `nearmiss replay` compares. A re-run that needs more rounds than the recording has ends
with no edit, as a playbook does.
"""

from __future__ import annotations

from kb.events import EventStore
from nearmiss.events import FixProposed, of_type
from workflows.models import FixInput, FixOutcome, model_argument


async def recorded_fix(store: EventStore, request: FixInput) -> FixOutcome:
    session_id = model_argument(request.model)
    recorded = of_type(await store.read_stream(session_id), FixProposed)
    fixes = [fix for fix in recorded if fix.round == request.round]
    if not fixes:
        return FixOutcome(
            model=request.model,
            reason=f"the recording of {session_id} has no round {request.round}",
        )
    fix = fixes[0]
    return FixOutcome(
        candidate_hash=fix.candidate_hash,
        summary=fix.summary,
        reason=fix.reason,
        model=request.model,
        # The recorded prompt and answer, by hash: the re-run shows what the model was told.
        prompt_hash=fix.prompt_hash,
        response_hash=fix.response_hash,
        resume_at=fix.resume_at,  # a search's round that went on in the next
    )
