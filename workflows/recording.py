"""How a workflow records its events: through the ``record_events`` activity, at stream versions
the workflow tracks itself — so a retried recording is a no-op (appends are idempotent per
version) and a replayed workflow records nothing new. It runs in the workflow's own worker
(``routing.run_here``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.loop import PlannedEvent
    from workflows.models import RecordInput
    from workflows.retries import infra_retry
    from workflows.routing import run_here

RECORD_OPTIONS: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=30),
    retry_policy=infra_retry(),  # the event store may be restarting: wait it out
)


async def record(version: int, events: list[PlannedEvent]) -> int:
    """Append ``events`` to this workflow's stream after ``version``; returns the new version."""
    if not events:
        return version
    request = RecordInput(
        stream_id=workflow.info().workflow_id,
        expected_version=version,
        events=[e.model_dump(mode="json") for e in events],
    )
    await run_here("record_events", request, **RECORD_OPTIONS)
    return version + len(events)
