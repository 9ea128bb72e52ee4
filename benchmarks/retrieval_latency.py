"""Does retrieving knowledge slow down as the event log grows?

On a throw-away PostgreSQL (``private_postgres``) with the seed knowledge loaded, fills the log
with synthetic repair sessions (20 events each, like a playbook session: checks, retrievals,
fixes, validations, some failing; a learned entry every 50 sessions) and measures what a
session's ``retrieve_knowledge`` activity does — catch the knowledge projection up on the events
since the last call (one new session's), then ``retrieve`` and ``failed_attempts`` — first with
SMALL events in the log, then with LARGE. Prints the median latency at each size and their
ratio, and how long the projection took to read the whole large log once.

    .venv/bin/python benchmarks/retrieval_latency.py [--small 1000] [--large 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from throwaway import private_postgres

from kb.events import EventStore, NewEvent
from kb.knowledge import KnowledgeProjection, failed_attempts, load_seed, retrieve
from nearmiss.engine.models import Evidence
from nearmiss.events import (
    CandidateValidated,
    Event,
    EvidenceCollected,
    FixProposed,
    GuardTripped,
    KnowledgeRetrieved,
    RepairFinished,
    RepairStarted,
)
from nearmiss.reports.text import table

SESSION_EVENTS = 20
CLASSES = ("wrong_values", "compile_error", "shape_mismatch", "nan_or_inf")
CATEGORIES = ("elementwise", "reduction", "matmul", "attention")


def session_events(n: int) -> list[NewEvent]:
    """A playbook-like session: 20 events, every fourth validation failing."""
    failure, category = CLASSES[n % len(CLASSES)], CATEGORIES[n % len(CATEGORIES)]
    base, edited = f"sha256:{n:064x}", f"sha256:{n + 1:064x}"
    check = EvidenceCollected(
        phase="validate",
        candidate_hash=edited,
        suite="compact",
        certified=False,
        failure_class=failure,
        category=category,
        score=0.5,
    )
    started = RepairStarted(
        spec_hash=base, candidate_hash=base, candidate_name="k.py", kernel=f"k{n}"
    )
    events: list[Event] = [started]
    for round_ in range(1, 5):
        summary = f"edit {n % 97}"
        events += [
            check,
            KnowledgeRetrieved(round=round_, entry_ids=[], patches=[]),
            FixProposed(
                round=round_,
                model="playbook",
                summary=summary,
                reason="",
                base_hash=base,
                candidate_hash=edited,
            ),
            CandidateValidated(
                round=round_,
                candidate_hash=edited,
                outcome="same" if round_ % 4 == 0 else "improved",
                score=0.5,
                best_hash=edited,
                summary=summary,
                aimed_at=f"{failure}|{category}",
                base_hash=base,
            ),
        ]
    events += [check, GuardTripped(guard="no_progress", detail="the same failure 3 rounds")]
    events.append(
        RepairFinished(
            session_id=f"repair-{n}",
            certified=n % 3 == 0,
            rounds=4,
            stop_reason="no_progress",
            stop_detail="",
            tokens={},
            original_hash=base,
            final_hash=edited,
        )
    )
    return [NewEvent.of(event) for event in events[:SESSION_EVENTS]]


def learned_entry(n: int) -> NewEvent:
    entry = {
        "id": f"learned-{n}",
        "title": f"learned fix {n}",
        "signature": {
            "failure_class": CLASSES[n % len(CLASSES)],
            "category": CATEGORIES[n % len(CATEGORIES)],
            "platform": "interpret",
        },
        "diagnosis": "a value off by one block",
        "guidance": "bound the last block",
        "diff": "--- a\n+++ b\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
    }
    return NewEvent("KnowledgeAdded", {"entry": entry, "source": "learned", "status": "candidate"})


async def fill(store: EventStore, sessions: range) -> None:
    async def one(n: int) -> None:
        await store.append(f"repair-bench-{n}", 0, session_events(n))
        if n % 50 == 0:
            await store.append(f"kb-learned-{n}", 0, [learned_entry(n)])

    for start in range(sessions.start, sessions.stop, 64):
        await asyncio.gather(*(one(n) for n in range(start, min(start + 64, sessions.stop))))


async def latency(store: EventStore, first: int, samples: int) -> float:
    """Median seconds of one retrieval after one more session's events."""
    times = []
    for n in range(first, first + samples):
        await fill(store, range(n, n + 1))
        evidence = Evidence(
            candidate_hash=f"sha256:{n:064x}",
            suite="compact",
            certified=False,
            failure_class=CLASSES[n % len(CLASSES)],
            category=CATEGORIES[n % len(CATEGORIES)],
            platform="interpret",
        )
        began = time.perf_counter()
        await retrieve(store, evidence, 4000)
        await failed_attempts(store, evidence)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


async def measure(dsn: str, args) -> None:
    store = await EventStore.connect(dsn, max_size=8)
    try:
        await load_seed(store)
        small = args.small // SESSION_EVENTS
        await fill(store, range(small))
        await KnowledgeProjection(store).catch_up()
        at_small = await latency(store, small, args.samples)
        large = args.large // SESSION_EVENTS
        began = time.perf_counter()
        await fill(store, range(small + args.samples, large))
        filled = time.perf_counter() - began
        began = time.perf_counter()
        read = await KnowledgeProjection(store).catch_up()
        caught_up = time.perf_counter() - began
        at_large = await latency(store, large, args.samples)
        async with store.pool.acquire() as conn:
            total = await conn.fetchval("SELECT count(*) FROM events")
            entries = await conn.fetchval("SELECT count(*) FROM kb_entries")
    finally:
        await store.close()
    rows = [
        [f"{args.small:,}", f"{at_small * 1000:.1f}"],
        [f"{total:,}", f"{at_large * 1000:.1f}"],
    ]
    print(table(["events in the log", "retrieval ms (median)"], rows))
    print(f"\nratio at {total:,} / at {args.small:,} events: {at_large / at_small:.2f}x")
    written = (large - small - args.samples) * SESSION_EVENTS
    print(f"{entries} knowledge entries; the log filled at {written / filled:,.0f} events/s")
    print(f"the projection read {read:,} events in {caught_up:.1f} s ({read / caught_up:,.0f}/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    with private_postgres() as dsn:
        asyncio.run(measure(dsn, args))


if __name__ == "__main__":
    main()
