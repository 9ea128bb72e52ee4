"""How fast does the event log take appends: one statement per batch vs one per event?

Starts a throw-away PostgreSQL of its own (``private_postgres``) and has WRITERS concurrent
writers append EVENTS events each to their own streams, through ``EventStore.append`` (the whole
batch in one statement) and through the row-by-row append it replaced (one INSERT round trip
per event, kept here as the baseline), interleaved so that load drifts hit both alike. Both
hold the same advisory lock, so positions commit in order either way. Prints events per second
for each and their ratio, for single-event appends and for batches.

    .venv/bin/python benchmarks/event_appends.py [--writers 8] [--events 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from throwaway import private_postgres

from kb.events import _APPEND_LOCK, EventStore, NewEvent
from nearmiss.reports.text import table

# A typical event: EvidenceCollected's payload is a few hundred bytes of JSON.
PAYLOAD = {
    "phase": "validate",
    "candidate_hash": "sha256:" + "ab" * 32,
    "suite": "compact",
    "certified": False,
    "failure_class": "numerical_mismatch",
    "score": 0.42,
    "signature": "numerical_mismatch|compact/base|",
}


async def row_by_row(store: EventStore, stream_id: str, expected: int, events: list[NewEvent]):
    """The append as it was: one INSERT (and one round trip) per event."""
    async with store.pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _APPEND_LOCK)
        for offset, event in enumerate(events, start=1):
            await conn.fetchval(
                "INSERT INTO events (stream_id, version, type, payload) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (stream_id, version) DO NOTHING "
                "RETURNING position",
                stream_id,
                expected + offset,
                event.type,
                event.payload,
            )


async def one_statement(store: EventStore, stream_id: str, expected: int, events):
    await store.append(stream_id, expected, events)


async def rate(store: EventStore, append, writers: int, events: int, batch: int) -> float:
    """Events per second with ``writers`` concurrent writers of ``events`` each."""

    async def write() -> None:
        sid = f"bench-{uuid.uuid4().hex}"
        for start in range(0, events, batch):
            # Built here, as a writer does: each is checked against its model (nearmiss.events).
            chunk = [NewEvent("EvidenceCollected", {**PAYLOAD, "score": n}) for n in range(batch)]
            await append(store, sid, start, chunk)

    began = time.perf_counter()
    await asyncio.gather(*(write() for _ in range(writers)))
    return writers * events / (time.perf_counter() - began)


async def measure(dsn: str, args) -> None:
    store = await EventStore.connect(dsn, max_size=args.writers)
    try:
        rows = []
        for batch in (1, 20):
            rates: dict[str, list[float]] = {"row": [], "batch": []}
            for _ in range(args.repeat):
                for name, append in (("row", row_by_row), ("batch", one_statement)):
                    rates[name].append(await rate(store, append, args.writers, args.events, batch))
            row, one = statistics.median(rates["row"]), statistics.median(rates["batch"])
            rows.append(
                [str(batch), str(args.writers), f"{row:,.0f}", f"{one:,.0f}", f"{one / row:.2f}x"]
            )
    finally:
        await store.close()
    headers = ["events/append", "writers", "row by row ev/s", "one statement ev/s", "ratio"]
    print(table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--events", type=int, default=1000, help="per writer and run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with private_postgres() as dsn:
        asyncio.run(measure(dsn, args))


if __name__ == "__main__":
    main()
