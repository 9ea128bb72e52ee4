"""Reading experiments back from the event log: the table of one, the list of all."""

from __future__ import annotations

from typing import cast

from kb.events import EventStore
from nearmiss.engine.errors import UsageError
from nearmiss.events import (
    ExperimentFinished,
    ExperimentStarted,
    RegenerateFinished,
    RepairFinished,
    of_type,
    parse,
)
from nearmiss.experiments.table import Finish, Table, compute_table

FINISHING = (RepairFinished.TYPE, RegenerateFinished.TYPE)


def sessions_of(finished: ExperimentFinished) -> list[str]:
    cells = [cell for by_near_miss in finished.arms.values() for cell in by_near_miss.values()]
    return [sid for cell in cells for sid in cell["sessions"]]


async def load_table(store: EventStore, experiment_id: str) -> Table:
    """The table recomputed from the experiment's events and its sessions' finishing events."""
    events = await store.read_stream(f"experiment-{experiment_id}")
    started = next(iter(of_type(events, ExperimentStarted)), None)
    finished = next(iter(of_type(events, ExperimentFinished)), None)
    if started is None:
        raise UsageError(f"no experiment {experiment_id!r} in the event log")
    if finished is None:
        raise UsageError(f"experiment {experiment_id!r} has not finished")
    # A session's last event is how it finished (learning writes to the knowledge streams).
    heads = await store.heads(sessions_of(finished))
    finishes = {
        sid: cast(Finish, parse(head.type, head.payload)) if head.type in FINISHING else None
        for sid, head in heads.items()
    }
    return compute_table(started, finished, finishes)


async def list_experiments(store: EventStore, limit: int = 50) -> list[dict]:
    """The newest experiments first: id, when, model, arms, near-misses, finished or not."""
    started = await store.recent_of_type("ExperimentStarted", limit)
    ids = [e.stream_id for e in started]
    heads = await store.heads(ids)
    listed = []
    for e in started:
        config = cast(ExperimentStarted, parse(e.type, e.payload)).config
        listed.append(
            {
                "experiment_id": e.payload["experiment_id"],
                "started_at": e.recorded_at.isoformat(timespec="seconds"),
                "model": config["model"],
                "arms": config["arms"],
                "near_misses": len(config["near_misses"]),
                "trials": config["trials"],
                "finished": heads[e.stream_id].type == ExperimentFinished.TYPE,
            }
        )
    return listed
