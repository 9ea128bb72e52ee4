"""Reading experiments back from the event log: the table of one, the list of all."""

from __future__ import annotations

from kb.events import EventStore
from nearmiss.engine.errors import UsageError
from nearmiss.experiments.table import Table, compute_table

FINISHING = ("RepairFinished", "RegenerateFinished")


def sessions_of(finished: dict) -> list[str]:
    cells = [cell for by_near_miss in finished["arms"].values() for cell in by_near_miss.values()]
    return [sid for cell in cells for sid in cell["sessions"]]


async def load_table(store: EventStore, experiment_id: str) -> Table:
    """The table recomputed from the experiment's events and its sessions' finishing events."""
    events = await store.read_stream(f"experiment-{experiment_id}")
    started = next((e.payload for e in events if e.type == "ExperimentStarted"), None)
    finished = next((e.payload for e in events if e.type == "ExperimentFinished"), None)
    if started is None:
        raise UsageError(f"no experiment {experiment_id!r} in the event log")
    if finished is None:
        raise UsageError(f"experiment {experiment_id!r} has not finished")
    # A session's last event is how it finished (learning writes to the knowledge streams).
    heads = await store.heads(sessions_of(finished))
    finishes = {
        sid: (head.payload if head.type in FINISHING else None) for sid, head in heads.items()
    }
    return compute_table(started, finished, finishes)


async def list_experiments(store: EventStore, limit: int = 50) -> list[dict]:
    """The newest experiments first: id, when, model, arms, near-misses, finished or not."""
    started = await store.recent_of_type("ExperimentStarted", limit)
    ids = [e.stream_id for e in started]
    heads = await store.heads(ids)
    return [
        {
            "experiment_id": e.payload["experiment_id"],
            "started_at": e.recorded_at.isoformat(timespec="seconds"),
            "model": e.payload["config"]["model"],
            "arms": e.payload["config"]["arms"],
            "near_misses": len(e.payload["config"]["near_misses"]),
            "trials": e.payload["config"]["trials"],
            "finished": heads[e.stream_id].type == "ExperimentFinished",
        }
        for e in started
    ]
