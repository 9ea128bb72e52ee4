"""The event log on a real PostgreSQL: ordered, idempotent under retries, conflicts refused."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from kb.events import EventConflict, NewEvent, content_hash


def stream() -> str:
    return f"repair-{uuid.uuid4()}"


async def test_events_append_in_order_with_global_positions(store):
    sid = stream()
    positions = await store.append(
        sid, 0, [NewEvent("RepairStarted", {"kernel": "k"}), NewEvent("EvidenceCollected", {})]
    )
    assert positions == sorted(positions) and len(set(positions)) == 2
    events = await store.read_stream(sid)
    assert [(e.version, e.type) for e in events] == [(1, "RepairStarted"), (2, "EvidenceCollected")]
    assert events[0].payload == {"kernel": "k"}
    assert await store.stream_version(sid) == 2


async def test_a_retried_append_records_nothing_twice(store):
    sid = stream()
    event = NewEvent("FixProposed", {"model": "playbook", "tokens": {"input": 0}})
    first = await store.append(sid, 0, [event])
    again = await store.append(sid, 0, [event])  # an activity retried after its append landed
    assert first == again
    assert len(await store.read_stream(sid)) == 1


async def test_a_different_event_at_a_taken_version_is_a_conflict(store):
    sid = stream()
    await store.append(sid, 0, [NewEvent("RepairStarted", {"kernel": "a"})])
    with pytest.raises(EventConflict):
        await store.append(sid, 0, [NewEvent("RepairStarted", {"kernel": "b"})])
    # The failed append left nothing half-written.
    assert [e.payload for e in await store.read_stream(sid)] == [{"kernel": "a"}]


async def test_concurrent_writers_commit_positions_in_order(store):
    streams = [stream() for _ in range(8)]

    async def write(sid: str) -> None:
        for version in range(5):
            await store.append(sid, version, [NewEvent("CandidateValidated", {"v": version})])

    await asyncio.gather(*(write(s) for s in streams))
    mine = [e for e in await store.read_all(limit=100_000) if e.stream_id in streams]
    assert len(mine) == 40
    for sid in streams:
        assert [e.payload["v"] for e in mine if e.stream_id == sid] == list(range(5))


async def test_blobs_are_stored_once_by_content_hash(store):
    source = b"def kernel(x):\n    return x\n"
    digest = await store.put_blob(source)
    assert digest == content_hash(source) == await store.put_blob(source)
    assert await store.get_blob(digest) == source
    with pytest.raises(KeyError):
        await store.get_blob(content_hash(b"never stored"))


def test_unknown_event_types_are_refused():
    with pytest.raises(ValueError, match="unknown event type"):
        NewEvent("SomethingHappened", {})
