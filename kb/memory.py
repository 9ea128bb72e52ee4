"""The event log in memory: ``EventLog``'s behaviour without a database, for fast tests.

Positions, versions, idempotent retries and conflicts behave as ``append_events`` does on
PostgreSQL (tests/test_event_store.py runs the same contract on both): an event identical to
the one at its version is passed over, a different one raises EventConflict and the batch
writes nothing; payloads are stored and returned as JSON, so a caller's later change to its
dict never reaches the log.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from kb.events import EventConflict, EventLog, NewEvent, StoredEvent, content_hash


def _as_stored(event: StoredEvent) -> StoredEvent:
    """A copy whose payload the caller may change (PostgreSQL returns fresh ones too)."""
    payload = json.loads(json.dumps(event.payload))
    return StoredEvent(
        event.position, event.stream_id, event.version, event.type, payload, event.recorded_at
    )


class MemoryEventStore(EventLog):
    def __init__(self) -> None:
        self.events: list[StoredEvent] = []  # in position order
        self.by_version: dict[tuple[str, int], StoredEvent] = {}
        self.blobs: dict[str, bytes] = {}

    async def close(self) -> None:
        pass

    async def append(
        self, stream_id: str, expected_version: int, events: list[NewEvent]
    ) -> list[int]:
        # No await until the end: the batch is checked and written in one step, as the
        # statement's own transaction does.
        payloads = [json.loads(json.dumps(e.payload)) for e in events]
        positions: list[int | None] = []
        for i, (event, payload) in enumerate(zip(events, payloads, strict=True), start=1):
            old = self.by_version.get((stream_id, expected_version + i))
            if old is None:
                positions.append(None)
            elif old.type != event.type or old.payload != payload:
                raise EventConflict(
                    f"{stream_id} v{expected_version + i} holds {old.type}, not {event.type}"
                )
            else:
                positions.append(old.position)
        written = []
        for i, (event, payload, position) in enumerate(
            zip(events, payloads, positions, strict=True), start=1
        ):
            if position is None:
                position = len(self.events) + 1
                stored = StoredEvent(
                    position,
                    stream_id,
                    expected_version + i,
                    event.type,
                    payload,
                    datetime.now(UTC),
                )
                self.events.append(stored)
                self.by_version[(stream_id, stored.version)] = stored
            written.append(position)
        return written

    async def read_stream(self, stream_id: str, after_version: int = 0) -> list[StoredEvent]:
        mine = [e for e in self.events if e.stream_id == stream_id and e.version > after_version]
        return [_as_stored(e) for e in sorted(mine, key=lambda e: e.version)]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        return [_as_stored(e) for e in self.events[after_position : after_position + limit]]

    async def heads(self, stream_ids: list[str]) -> dict[str, StoredEvent]:
        last: dict[str, StoredEvent] = {}
        for event in self.events:
            head = last.get(event.stream_id)
            if event.stream_id in stream_ids and (head is None or event.version > head.version):
                last[event.stream_id] = event
        return {sid: _as_stored(e) for sid, e in last.items()}

    async def recent_of_type(self, event_type: str, limit: int = 50) -> list[StoredEvent]:
        newest = [e for e in reversed(self.events) if e.type == event_type][:limit]
        return [_as_stored(e) for e in newest]

    async def stream_version(self, stream_id: str) -> int:
        return max((e.version for e in self.events if e.stream_id == stream_id), default=0)

    async def put_blob(self, content: bytes) -> str:
        digest = content_hash(content)
        self.blobs.setdefault(digest, bytes(content))
        return digest

    async def get_blob(self, digest: str) -> bytes:
        return self.blobs[digest]
