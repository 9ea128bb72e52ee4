"""The event log: every step of every repair, append-only in PostgreSQL (asyncpg).

A stream is one repair session; each event has its stream's next ``version`` and a global
``position``. Appends are idempotent so an activity Temporal retries can record again safely:
re-appending the same event at the same version is a no-op, a *different* event at a taken
version is a conflict. Writers are serialised with a transaction-scoped advisory lock so global
positions commit in order and a reader tailing ``position`` never skips an event. An append is
one statement (the ``append_events`` function), one round trip however many events it holds:
benchmarks/event_appends.py measures it against one INSERT per event.

Sources, prompts and other large artifacts go to ``blobs`` by SHA-256 and events carry the
hash: history stays small and identical artifacts are stored once.

``EventLog`` is what readers and writers of the log need; ``EventStore`` is it on PostgreSQL,
``kb.memory.MemoryEventStore`` the same behaviour in memory, for tests without a database
(tests/test_event_store.py runs the log's contract on both).
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from nearmiss.engine.runner.scratch import scratch_dir
from nearmiss.events import Event, parse

# The log's own schema: each migration runs once, in order (``migrate``). Projections of the
# log own theirs (kb/knowledge.py: ``KNOWLEDGE_SCHEMA``), applied the same way under their name.
LOG = "log"
MIGRATIONS: list[str] = [
    """
    CREATE TABLE events (
        position    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        stream_id   TEXT NOT NULL,
        version     INTEGER NOT NULL CHECK (version >= 1),
        type        TEXT NOT NULL,
        payload     JSONB NOT NULL,
        recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (stream_id, version)
    );
    CREATE INDEX events_type ON events (type, position);
    CREATE TABLE blobs (
        hash       TEXT PRIMARY KEY,
        content    BYTEA NOT NULL,
        size       INTEGER NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    """,
    # An append in one statement, so one round trip however many events (EventStore.append):
    # it takes the writers' lock, inserts in version order (positions grow with versions),
    # passes over a version that already holds this very event (a retried append) and raises
    # NMCON for one that holds another; the statement's own transaction then writes nothing.
    """
    CREATE FUNCTION append_events(stream TEXT, after_version INTEGER, types TEXT[],
                                  payloads TEXT[]) RETURNS SETOF BIGINT
    LANGUAGE plpgsql AS $$
    DECLARE
        i INTEGER;
        pos BIGINT;
        old RECORD;
    BEGIN
        PERFORM pg_advisory_xact_lock(1852664179);  -- _APPEND_LOCK
        FOR i IN 1 .. coalesce(array_length(types, 1), 0) LOOP
            pos := NULL;
            INSERT INTO events (stream_id, version, type, payload)
            VALUES (stream, after_version + i, types[i], payloads[i]::jsonb)
            ON CONFLICT (stream_id, version) DO NOTHING
            RETURNING position INTO pos;
            IF pos IS NULL THEN
                SELECT e.position, e.type, e.payload INTO old FROM events e
                WHERE e.stream_id = stream AND e.version = after_version + i;
                IF old.type <> types[i] OR old.payload <> payloads[i]::jsonb THEN
                    RAISE EXCEPTION '% v% holds %, not %', stream, after_version + i, old.type,
                        types[i] USING ERRCODE = 'NMCON';
                END IF;
                pos := old.position;
            END IF;
            RETURN NEXT pos;
        END LOOP;
    END $$;
    """,
]
# Any constant would do; it only has to be the same for every writer of this database (the
# append_events function of MIGRATIONS holds it too).
_APPEND_LOCK = 0x6E6D6973


class EventConflict(Exception):
    """A different event already holds that stream version (a concurrent or diverged writer)."""


@dataclass(frozen=True)
class NewEvent:
    type: str
    payload: dict[str, Any]

    def __post_init__(self) -> None:
        # Every write is checked against its type's model (nearmiss.events): a renamed or
        # missing field fails here, at the writer, not in a reader of the log.
        parse(self.type, self.payload)

    @classmethod
    def of(cls, event: Event) -> NewEvent:
        """The typed event, to append."""
        return cls(event.TYPE, event.payload())


@dataclass(frozen=True)
class StoredEvent:
    position: int
    stream_id: str
    version: int
    type: str
    payload: dict[str, Any]
    recorded_at: datetime


def content_hash(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


# Before each part of the schema had an owner, one list numbered 1..5 held them all, recorded
# in schema_migrations: 1 and 5 were the log's (events and blobs; append_events), 2-4 the
# knowledge projection's. A database from then is carried over once, nothing applied again.
_LEGACY = {LOG: (1, 5), "knowledge": (2, 3, 4)}


async def migrate(
    conn: asyncpg.Connection, owner: str = LOG, statements: list[str] | None = None
) -> int:
    """Bring ``owner``'s part of the schema up to date (the log's by default); returns its
    version. Each owner's migrations run once, in order, recorded in schema_versions."""
    statements = MIGRATIONS if statements is None else statements
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _APPEND_LOCK + 1)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions (owner TEXT PRIMARY KEY, "
            "version INTEGER NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            done = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
            for legacy_owner, versions in _LEGACY.items():
                await conn.execute(
                    "INSERT INTO schema_versions (owner, version) VALUES ($1, $2)",
                    legacy_owner,
                    sum(v <= done for v in versions),
                )
            await conn.execute("DROP TABLE schema_migrations")
        done = await conn.fetchval(
            "SELECT coalesce(max(version), 0) FROM schema_versions WHERE owner = $1", owner
        )
        for version, statement in enumerate(statements, start=1):
            if version > done:
                await conn.execute(statement)
        if len(statements) > done:
            await conn.execute(
                "INSERT INTO schema_versions (owner, version) VALUES ($1, $2) ON CONFLICT (owner) "
                "DO UPDATE SET version = excluded.version, applied_at = now()",
                owner,
                len(statements),
            )
    return max(done, len(statements))


class EventLog(abc.ABC):
    """The event log and blob store as its readers and writers see it."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def append(
        self, stream_id: str, expected_version: int, events: list[NewEvent]
    ) -> list[int]:
        """Append ``events`` as versions expected_version+1...; returns their positions.

        Idempotent: an event identical to the one already at its version is not written again
        (its existing position is returned). Raises EventConflict on a different event, and
        then writes none of the batch.
        """

    @abc.abstractmethod
    async def read_stream(self, stream_id: str, after_version: int = 0) -> list[StoredEvent]: ...

    @abc.abstractmethod
    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events of every stream in global order, for projections that tail the log."""

    @abc.abstractmethod
    async def heads(self, stream_ids: list[str]) -> dict[str, StoredEvent]:
        """The last event of each of these streams that has any."""

    @abc.abstractmethod
    async def recent_of_type(self, event_type: str, limit: int = 50) -> list[StoredEvent]:
        """The newest events of one type across all streams, newest first."""

    @abc.abstractmethod
    async def stream_version(self, stream_id: str) -> int: ...

    @abc.abstractmethod
    async def put_blob(self, content: bytes) -> str: ...

    @abc.abstractmethod
    async def get_blob(self, digest: str) -> bytes:
        """The blob's content; KeyError when none has that digest."""

    @contextlib.asynccontextmanager
    async def checkout(
        self, spec_hash: str, candidate_hash: str, candidate_name: str, purpose: str
    ) -> AsyncIterator[tuple[Path, Path]]:
        """(spec path, candidate path): a spec and a candidate from the blob store as files in
        a private temporary folder, for the engine to check or run; removed afterwards."""
        spec = await self.get_blob(spec_hash)
        source = await self.get_blob(candidate_hash)
        # A scratch directory names its owner: if this worker is killed, the next one sweeps it.
        tmp = scratch_dir(f"nearmiss-{purpose}-")
        try:
            if Path(candidate_name).name != candidate_name or candidate_name in ("", ".", ".."):
                raise ValueError(f"not a file name: {candidate_name!r}")
            # Each in a folder of its own: a candidate named spec.py, next to the spec, was
            # written over it, and every check of its repair judged it by a spec it wrote.
            spec_path = tmp / "spec" / "spec.py"
            candidate_path = tmp / "candidate" / candidate_name
            for path, content in ((spec_path, spec), (candidate_path, source)):
                path.parent.mkdir()
                path.write_bytes(content)
            yield spec_path, candidate_path
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class EventStore(EventLog):
    """The log on PostgreSQL; create with ``await EventStore.connect(dsn)``. The knowledge
    projection (kb.knowledge) reads and writes its own tables through ``pool``."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._schemas = {LOG}  # whose schema is known to be up to date on this database

    async def ensure_schema(self, owner: str, statements: list[str]) -> None:
        """Bring a projection's own tables up to date (``migrate``), once per store."""
        if owner in self._schemas:
            return
        async with self.pool.acquire() as conn:
            await migrate(conn, owner, statements)
        self._schemas.add(owner)

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 0, max_size: int = 4) -> EventStore:
        """A pool on ``dsn``; connections are made when needed (no floor kept: while the
        database restarts, nothing reconnects in the background, and the caller's retry
        policy decides)."""
        pool = await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, init=_init_connection
        )
        async with pool.acquire() as conn:
            await migrate(conn)
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def append(
        self, stream_id: str, expected_version: int, events: list[NewEvent]
    ) -> list[int]:
        if not events:
            return []
        async with self.pool.acquire() as conn:
            try:
                rows = await conn.fetch(
                    "SELECT append_events($1, $2, $3, $4) AS position",
                    stream_id,
                    expected_version,
                    [e.type for e in events],
                    [json.dumps(e.payload) for e in events],
                )
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == "NMCON":
                    raise EventConflict(exc.args[0] if exc.args else str(exc)) from None
                raise
        return [row["position"] for row in rows]

    async def read_stream(self, stream_id: str, after_version: int = 0) -> list[StoredEvent]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT * FROM events WHERE stream_id = $1 AND version > $2 ORDER BY version",
                stream_id,
                after_version,
            )
        return [StoredEvent(**dict(row)) for row in rows]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events of every stream in global order, for projections that tail the log."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT * FROM events WHERE position > $1 ORDER BY position LIMIT $2",
                after_position,
                limit,
            )
        return [StoredEvent(**dict(row)) for row in rows]

    async def heads(self, stream_ids: list[str]) -> dict[str, StoredEvent]:
        """The last event of each of these streams that has any, in one query."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT DISTINCT ON (stream_id) * FROM events WHERE stream_id = ANY($1::text[]) "
                "ORDER BY stream_id, version DESC",
                stream_ids,
            )
        return {row["stream_id"]: StoredEvent(**dict(row)) for row in rows}

    async def recent_of_type(self, event_type: str, limit: int = 50) -> list[StoredEvent]:
        """The newest events of one type across all streams, e.g. every fleet's FleetStarted."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT * FROM events WHERE type = $1 ORDER BY position DESC LIMIT $2",
                event_type,
                limit,
            )
        return [StoredEvent(**dict(row)) for row in rows]

    async def stream_version(self, stream_id: str) -> int:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT coalesce(max(version), 0) FROM events WHERE stream_id = $1", stream_id
            )

    async def put_blob(self, content: bytes) -> str:
        digest = content_hash(content)
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO blobs (hash, content, size) VALUES ($1, $2, $3) "
                "ON CONFLICT (hash) DO NOTHING",
                digest,
                content,
                len(content),
            )
        return digest

    async def get_blob(self, digest: str) -> bytes:
        async with self.pool.acquire() as conn:
            content = await conn.fetchval("SELECT content FROM blobs WHERE hash = $1", digest)
        if content is None:
            raise KeyError(digest)
        return bytes(content)
