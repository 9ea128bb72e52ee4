"""Which workers poll each task queue (``workflows.routing``), so a user sees which targets a
fleet can be checked on before starting it, and why a session waits (``nearmiss workers``).

Temporal remembers a poller for a few minutes after its last poll; the "last poll" column tells
a live worker (seconds) from one that has just gone.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

# Temporal's modules are imported where used: `nearmiss --help` and the other commands stay light.


async def _pollers(client, queue: str, kind: str) -> list:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    kinds = {
        "workflows": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        "activities": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    }
    request = DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kinds[kind]
    )
    return list((await client.workflow_service.describe_task_queue(request)).pollers)


async def list_workers(client) -> list[dict]:
    """One row per queue and worker polling it (``worker`` None for a queue nobody polls):
    ``queue``, ``target`` (None for the general queue), ``worker``, ``last_poll_s``."""
    from nearmiss.engine.targets.registry import TARGETS
    from workflows.routing import GENERAL_QUEUE, queue_of

    queues = {GENERAL_QUEUE: None} | {queue_of(t): t for t in TARGETS}
    # Workflows poll only the general queue; activities poll all of them.
    asks = [(q, "activities") for q in queues] + [(GENERAL_QUEUE, "workflows")]
    answers = await asyncio.gather(*(_pollers(client, q, kind) for q, kind in asks))
    now = datetime.now(UTC)
    seen: dict[tuple[str, str], float] = {}
    for (queue, _), pollers in zip(asks, answers, strict=True):
        for poller in pollers:
            age = (now - poller.last_access_time.ToDatetime(UTC)).total_seconds()
            key = (queue, poller.identity)
            seen[key] = min(age, seen.get(key, age))
    rows = []
    for queue, target in queues.items():
        # (a queue no worker polls has one row, with no worker and no poll)
        workers: list[tuple[str | None, float | None]]
        workers = sorted((w, age) for (q, w), age in seen.items() if q == queue)
        for worker, age in workers or [(None, None)]:
            last = None if age is None else round(max(age, 0.0), 1)
            rows.append({"queue": queue, "target": target, "worker": worker, "last_poll_s": last})
    return rows
