"""The knowledge base: entries are events, the table is a projection, retrieval ranks it.

- **Seed** entries ship as data (``kb/seed/*.json``) and enter the log as ``KnowledgeAdded``
  events, one stream per entry; loading is idempotent, and a changed seed is a
  ``KnowledgeRevised`` event, so the log says when guidance changed.
- **Projection**: ``KnowledgeProjection.catch_up`` applies events after its checkpoint, in global
  order, each batch in one transaction with the checkpoint, so a restart resumes where it
  stopped. Gaps in the position (rolled-back appends) are simply absent rows: it keeps the last
  position it saw, never a count. ``KnowledgeRetrieved`` counts a use for a session,
  ``RepairFinished`` turns that session's uses into successes or failures.
- **Negative knowledge**: a fix a session validated as no help (``CandidateValidated``) is a
  note against the failure it aimed at, and the note's rank is its evidence, never how often it
  was recorded: the sessions that saw it fail, one vote each however often they repeated it,
  counted as independent the way learning counts teachers (``kb.learning.independent``: no two
  on one kernel shape or in one fleet). Notes from sessions on a kernel whose shape a
  certified repair fixed (``kb.learning.certified_fix``: the attempt was a wrong turn beside a
  real fix) come before notes from kernels never fixed. So one session, one kernel or one fleet
  repeating an attempt cannot push it to the top of every prompt.
- **Retrieval** ranks promoted entries by signature match (failure class, category, platform),
  overlap of their words with the evidence's, and success rate, then fits a character budget.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb.events import EventStore, NewEvent, StoredEvent
from kb.learning import Refused, certified_fix, fleet_of, independent, source_shape, teachers
from nearmiss.engine.models import Evidence
from nearmiss.events import (
    CandidateValidated,
    InvalidEvent,
    KnowledgeAdded,
    KnowledgePromoted,
    KnowledgeRetrieved,
    KnowledgeRevised,
    RepairFinished,
    RepairStarted,
    parse,
)

SEED_DIR = Path(__file__).resolve().parent / "seed"
PROJECTION = "knowledge"
# The projection's own tables, migrated under its name (kb.events.migrate), in order, each once.
KNOWLEDGE_SCHEMA: list[str] = [
    # Where the projection has read the log up to, and the entries with the evidence of use.
    """
    CREATE TABLE projection_checkpoints (
        name     TEXT PRIMARY KEY,
        position BIGINT NOT NULL
    );
    CREATE TABLE kb_entries (
        id            TEXT PRIMARY KEY,
        status        TEXT NOT NULL,
        source        TEXT NOT NULL,
        title         TEXT NOT NULL,
        failure_class TEXT NOT NULL,
        category      TEXT NOT NULL,
        platform      TEXT NOT NULL,
        body          JSONB NOT NULL,
        uses          INTEGER NOT NULL DEFAULT 0,
        successes     INTEGER NOT NULL DEFAULT 0,
        failures      INTEGER NOT NULL DEFAULT 0,
        updated_at    BIGINT NOT NULL
    );
    CREATE INDEX kb_entries_signature ON kb_entries (failure_class, category, platform);
    CREATE TABLE kb_session_uses (
        session_id TEXT NOT NULL,
        entry_id   TEXT NOT NULL,
        PRIMARY KEY (session_id, entry_id)
    );
    """,
    # Negative knowledge: fixes that did not help a failure (class | category), with how often
    # they were recorded (not their rank: kb_failed_attempt_sessions holds their evidence).
    """
    CREATE TABLE kb_failed_attempts (
        aimed_at TEXT NOT NULL,  -- failure class | category
        summary  TEXT NOT NULL,  -- what the fix said it did
        times    INTEGER NOT NULL,
        PRIMARY KEY (aimed_at, summary)
    );
    """,
    # Negative knowledge about one kernel: learned patches that made it worse, so a later
    # session on the same kernel does not try them again.
    """
    CREATE TABLE kb_harmful_patches (
        kernel_hash TEXT NOT NULL,  -- the candidate the patch was applied to
        patch       TEXT NOT NULL,  -- patch:<entry id>
        PRIMARY KEY (kernel_hash, patch)
    );
    """,
    # Negative knowledge ranked by evidence: each session that saw a fix fail (once however
    # often), the kernel shape it started from and whether it ended in a certified fix. The
    # events the projection read before these tables are read again for them alone
    # (KnowledgeProjection.reread), from the start up to where it had read.
    """
    CREATE TABLE kb_sessions (
        session_id TEXT PRIMARY KEY,
        origin     TEXT NOT NULL,  -- kb.learning.source_shape of its original
        certified  BOOLEAN NOT NULL DEFAULT false  -- passed kb.learning.certified_fix
    );
    CREATE INDEX kb_sessions_certified ON kb_sessions (origin) WHERE certified;
    CREATE TABLE kb_failed_attempt_sessions (
        aimed_at   TEXT NOT NULL,
        summary    TEXT NOT NULL,
        session_id TEXT NOT NULL,
        PRIMARY KEY (aimed_at, summary, session_id)
    );
    CREATE TABLE kb_rereads (
        name           TEXT PRIMARY KEY,
        after_position BIGINT NOT NULL,
        up_to          BIGINT NOT NULL
    );
    INSERT INTO kb_rereads (name, after_position, up_to)
    SELECT 'sessions', 0, position FROM projection_checkpoints
    WHERE name = 'knowledge' AND position > 0;
    """,
]
BATCH = 500
DEMOTE_AFTER_FAILURES = 3
# Validation outcomes that mean a fix did not help the failure it aimed at.
FAILED_OUTCOMES = ("regression_reverted", "same")
# The event types the projection reads; it passes over the others without parsing them.
APPLIED = {
    model.TYPE
    for model in (
        KnowledgeAdded,
        KnowledgeRevised,
        CandidateValidated,
        KnowledgePromoted,
        KnowledgeRetrieved,
        RepairStarted,
        RepairFinished,
    )
}
HARMFUL = ("regression_reverted",)  # made the kernel worse: never tried on that kernel again
MAX_FAILED_ATTEMPTS = 5
_WORD = re.compile(r"[a-z_][a-z0-9_]{2,}")
_STOP = frozenset(
    ["the", "and", "for", "are", "was", "with", "that", "this", "not", "but", "its", "from"]
)


@dataclass(frozen=True)
class Entry:
    id: str
    status: str  # promoted (enters prompts) | candidate (awaiting confirmation) | demoted
    source: str  # seed | learned
    title: str
    failure_class: str
    category: str
    platform: str
    body: dict[str, Any]
    uses: int = 0
    successes: int = 0
    failures: int = 0

    @property
    def success_rate(self) -> float:
        """Laplace-smoothed: an unused entry sits at 0.5."""
        return (self.successes + 1) / (self.uses + 2)

    def line(self) -> str:
        """How the entry reads in a fix prompt: the pattern and the reason, never a diff (an
        entry's example is a kernel's own edit: it would hand over that kernel's answer rather
        than teach the fix)."""
        text = f"[{self.id}] {self.title}. Seen as: {self.body.get('diagnosis', '')} "
        return text + f"Fix: {self.body.get('guidance', '')}"

    def hands_over(self, source: str) -> bool:
        """Whether this entry was written from ``source``'s own code: every line its example
        or learned diff keeps or removes (a few characters or more) is a line of ``source``.
        Such an entry would give that kernel's fix away; an evaluation holds it out."""
        kept = [
            line[1:].strip()
            for text in (self.body.get("diff") or "", self.body.get("example") or "")
            for line in text.splitlines()
            if line[:1] in ("-", " ") and not line.startswith("---")
        ]
        kept = [line for line in kept if len(line) >= 8]
        lines = {line.strip() for line in source.splitlines()}
        return bool(kept) and all(line in lines for line in kept)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "source": self.source,
            "title": self.title,
            "signature": {
                "failure_class": self.failure_class,
                "category": self.category,
                "platform": self.platform,
            },
            "bug_family": self.body.get("bug_family"),
            "uses": self.uses,
            "successes": self.successes,
            "failures": self.failures,
        }


# --- seed ------------------------------------------------------------------------------------


def seed_entries(seed_dir: Path = SEED_DIR) -> list[dict[str, Any]]:
    entries = []
    for path in sorted(seed_dir.glob("*.json")):
        entries += json.loads(path.read_text())
    return entries


async def load_seed(store: EventStore, seed_dir: Path = SEED_DIR) -> int:
    """Record every seed entry not yet in the log, or changed since; returns how many."""
    entries = seed_entries(seed_dir)
    # One query for what the log already holds: this runs at every command's start.
    heads = await store.heads([f"kb-{entry['id']}" for entry in entries])
    recorded = 0
    for entry in entries:
        stream = f"kb-{entry['id']}"
        head = heads.get(stream)
        if head is None:
            added = KnowledgeAdded(entry=entry, source="seed", status="promoted")
            await store.append(stream, 0, [NewEvent.of(added)])
        elif head.payload["entry"] != entry:
            revised = KnowledgeRevised(entry=entry, source="seed", status="promoted")
            await store.append(stream, head.version, [NewEvent.of(revised)])
        else:
            continue
        recorded += 1
    return recorded


# --- projection ------------------------------------------------------------------------------


class KnowledgeProjection:
    """The knowledge entries as the log says they are now, in tables of the projection's own
    (``KNOWLEDGE_SCHEMA``, created on first use)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def checkpoint(self) -> int:
        await _own_tables(self.store)
        async with self.store.pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT position FROM projection_checkpoints WHERE name = $1", PROJECTION
            )
        return value or 0

    async def catch_up(self) -> int:
        """Apply every event after the checkpoint; returns how many were read."""
        await self.reread()
        read = 0
        while True:
            after = await self.checkpoint()
            events = await self.store.read_all(after_position=after, limit=BATCH)
            if not events:
                return read
            async with self.store.pool.acquire() as conn, conn.transaction():
                # Concurrent catch-ups: the second waits, then finds the batch already applied.
                current = await conn.fetchval(
                    "SELECT position FROM projection_checkpoints WHERE name = $1 FOR UPDATE",
                    PROJECTION,
                )
                if (current or 0) != after:
                    continue
                for event in events:
                    await self._apply(conn, event)
                await conn.execute(
                    "INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2) "
                    "ON CONFLICT (name) DO UPDATE SET position = excluded.position",
                    PROJECTION,
                    events[-1].position,
                )
            read += len(events)

    async def reread(self) -> int:
        """Read the events this projection had read before it kept sessions' evidence (a
        database from before kb_sessions) again for that evidence alone, in batches, each in
        one transaction with where it got to; returns how many were read. Whatever was already
        recorded is not recorded twice, so a reread that overlaps catch_up changes nothing."""
        await _own_tables(self.store)
        read = 0
        while True:
            async with self.store.pool.acquire() as conn, conn.transaction():
                pending = await conn.fetchrow(
                    "SELECT after_position, up_to FROM kb_rereads WHERE name = 'sessions' "
                    "FOR UPDATE"
                )
                if pending is None:
                    return read
                rows = await conn.fetch(
                    "SELECT * FROM events WHERE position > $1 AND position <= $2 "
                    "AND type = ANY($3::text[]) ORDER BY position LIMIT $4",
                    pending["after_position"],
                    pending["up_to"],
                    sorted(_SESSION_EVIDENCE),
                    BATCH,
                )
                if not rows:
                    await conn.execute("DELETE FROM kb_rereads WHERE name = 'sessions'")
                    return read
                for row in rows:
                    await _session_evidence(conn, StoredEvent(**dict(row)))
                await conn.execute(
                    "UPDATE kb_rereads SET after_position = $1 WHERE name = 'sessions'",
                    rows[-1]["position"],
                )
            read += len(rows)

    @staticmethod
    async def _apply(conn, event: StoredEvent) -> None:
        if event.type not in APPLIED:
            return
        if event.type == RepairStarted.TYPE:
            await _session_evidence(conn, event)
            return
        typed = parse(event.type, event.payload)
        await _session_evidence(conn, event, typed)
        if isinstance(typed, KnowledgeAdded | KnowledgeRevised):
            entry = typed.entry
            signature = entry["signature"]
            await conn.execute(
                "INSERT INTO kb_entries (id, status, source, title, failure_class, category, "
                "platform, body, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                "ON CONFLICT (id) DO UPDATE SET status = excluded.status, title = excluded.title,"
                " failure_class = excluded.failure_class, category = excluded.category,"
                " platform = excluded.platform, body = excluded.body,"
                " updated_at = excluded.updated_at",
                entry["id"],
                typed.status,
                typed.source,
                entry["title"],
                signature["failure_class"],
                signature["category"],
                signature["platform"],
                entry,
                event.position,
            )
        elif isinstance(typed, CandidateValidated) and typed.outcome in FAILED_OUTCOMES:
            summary, kernel = typed.summary, typed.base_hash
            if summary.startswith("patch:") and kernel and typed.outcome in HARMFUL:
                await conn.execute(
                    "INSERT INTO kb_harmful_patches (kernel_hash, patch) VALUES ($1, $2) "
                    "ON CONFLICT DO NOTHING",
                    kernel,
                    summary,
                )
            if summary and typed.aimed_at:
                await conn.execute(
                    "INSERT INTO kb_failed_attempts (aimed_at, summary, times) "
                    "VALUES ($1, $2, 1) ON CONFLICT (aimed_at, summary) "
                    "DO UPDATE SET times = kb_failed_attempts.times + 1",
                    typed.aimed_at,
                    summary[:300],
                )
        elif isinstance(typed, KnowledgePromoted):
            await conn.execute(
                "UPDATE kb_entries SET status = 'promoted' WHERE id = $1",
                event.stream_id.removeprefix("kb-"),
            )
        elif isinstance(typed, KnowledgeRetrieved):
            for entry_id in typed.entry_ids:
                inserted = await conn.fetchval(
                    "INSERT INTO kb_session_uses (session_id, entry_id) VALUES ($1, $2) "
                    "ON CONFLICT DO NOTHING RETURNING entry_id",
                    event.stream_id,
                    entry_id,
                )
                if inserted:
                    await conn.execute(
                        "UPDATE kb_entries SET uses = uses + 1 WHERE id = $1", entry_id
                    )
        elif isinstance(typed, RepairFinished):
            column = "successes" if typed.certified else "failures"
            await conn.execute(
                f"UPDATE kb_entries SET {column} = {column} + 1 WHERE id IN "
                "(SELECT entry_id FROM kb_session_uses WHERE session_id = $1)",
                event.stream_id,
            )
            # Entries whose use goes with failures leave the prompts.
            await conn.execute(
                "UPDATE kb_entries SET status = 'demoted' WHERE status = 'promoted' "
                "AND failures >= $1 AND failures > 2 * successes AND id IN "
                "(SELECT entry_id FROM kb_session_uses WHERE session_id = $2)",
                DEMOTE_AFTER_FAILURES,
                event.stream_id,
            )

    async def entries(self, status: str | None = None) -> list[Entry]:
        await _own_tables(self.store)
        query = "SELECT * FROM kb_entries"
        args: list[Any] = []
        if status:
            query, args = query + " WHERE status = $1", [status]
        async with self.store.pool.acquire() as conn:
            rows = await conn.fetch(query + " ORDER BY id", *args)
        return [_entry(row) for row in rows]

    async def harmful_patches(self, kernel_hash: str) -> set[str]:
        """The learned patches (``patch:<id>``) that made this kernel worse before."""
        await _own_tables(self.store)
        async with self.store.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT patch FROM kb_harmful_patches WHERE kernel_hash = $1", kernel_hash
            )
        return {row["patch"] for row in rows}

    async def entry(self, entry_id: str) -> Entry | None:
        await _own_tables(self.store)
        async with self.store.pool.acquire() as conn:
            row = await conn.fetchrow("SELECT * FROM kb_entries WHERE id = $1", entry_id)
        return _entry(row) if row else None


async def _own_tables(store: EventStore) -> None:
    await store.ensure_schema(PROJECTION, KNOWLEDGE_SCHEMA)


# The events that make up a session's evidence for negative knowledge (``_session_evidence``).
_SESSION_EVIDENCE = {RepairStarted.TYPE, CandidateValidated.TYPE, RepairFinished.TYPE}


async def _session_evidence(conn, event: StoredEvent, typed: Any = None) -> None:
    """What one event says of its session for ranking negative knowledge: the kernel shape it
    started from (``RepairStarted``), a fix it saw fail (``CandidateValidated``), whether it
    ended in a certified fix (``RepairFinished``). Each is recorded once, however often the
    event is read (a reread, a replayed batch). ``typed``: the event parsed, where it was."""
    session = event.stream_id
    if typed is None and event.type != RepairStarted.TYPE:
        typed = parse(event.type, event.payload)
    if event.type == RepairStarted.TYPE:
        # Only the candidate is read: a start the projection has no other use for never stops
        # it, whatever else its payload holds.
        candidate = event.payload.get("candidate_hash") or ""
        if candidate:
            await conn.execute(
                "INSERT INTO kb_sessions (session_id, origin) VALUES ($1, $2) "
                "ON CONFLICT DO NOTHING",
                session,
                await _origin(conn, candidate),
            )
    elif isinstance(typed, CandidateValidated) and typed.outcome in FAILED_OUTCOMES:
        if typed.summary and typed.aimed_at:
            await conn.execute(
                "INSERT INTO kb_failed_attempt_sessions (aimed_at, summary, session_id) "
                "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                typed.aimed_at,
                typed.summary[:300],
                session,
            )
    elif isinstance(typed, RepairFinished) and typed.certified:
        rows = await conn.fetch(
            "SELECT * FROM events WHERE stream_id = $1 ORDER BY version", session
        )
        try:
            started, _, _ = certified_fix(StoredEvent(**dict(row)) for row in rows)
        except (Refused, InvalidEvent):
            return
        await conn.execute(
            "INSERT INTO kb_sessions (session_id, origin, certified) VALUES ($1, $2, true) "
            "ON CONFLICT (session_id) DO UPDATE SET certified = true",
            session,
            await _origin(conn, started.candidate_hash),
        )


async def _origin(conn, candidate_hash: str) -> str:
    """The kernel shape of a session's original (kb.learning.source_shape), or its hash where
    its text is not in the blob store."""
    content = await conn.fetchval("SELECT content FROM blobs WHERE hash = $1", candidate_hash)
    if content is None:
        return candidate_hash
    return source_shape(bytes(content).decode("utf-8", "replace"))


def _entry(row) -> Entry:
    fields = dict(row)
    fields.pop("updated_at", None)
    return Entry(**fields)


# --- retrieval -------------------------------------------------------------------------------


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def evidence_text(evidence: Evidence) -> str:
    parts = [evidence.diagnosis, evidence.structure_problem or ""]
    parts += [f"{v.rule} {v.detail}" for v in evidence.violations]
    return " ".join(parts)


def score(entry: Entry, evidence: Evidence, words: set[str]) -> float:
    """Signature match first, then shared words, then the record of past use."""
    if entry.failure_class == evidence.failure_class:
        signature = 3.0
    elif entry.failure_class in evidence.failure_classes:
        signature = 1.5
    else:
        return 0.0
    signature += {evidence.category: 2.0, "any": 0.5}.get(entry.category, -10.0)
    signature += {evidence.platform: 1.0, "any": 0.5}.get(entry.platform, -10.0)
    body = entry.body
    entry_words = _words(
        " ".join([entry.title, body.get("diagnosis", ""), " ".join(body.get("keywords", []))])
    )
    overlap = len(words & entry_words) / (len(entry_words) or 1)
    return signature + 3.0 * overlap + entry.success_rate


def rank(entries: list[Entry], evidence: Evidence, budget_chars: int) -> list[Entry]:
    """The best-matching entries whose prompt lines fit ``budget_chars`` together."""
    words = _words(evidence_text(evidence))
    scored = sorted(
        ((score(e, evidence, words), e) for e in entries), key=lambda se: (-se[0], se[1].id)
    )
    chosen, used = [], 0
    for value, entry in scored:
        if value <= 0:
            break
        size = len(entry.line())
        if used + size <= budget_chars:
            chosen.append(entry)
            used += size
    return chosen


async def failed_attempts(store: EventStore, evidence: Evidence) -> list[str]:
    """Negative knowledge: what was tried against this failure before and did not help, the
    best evidenced first, each with how many independent sessions saw it fail.

    A note's evidence is its sessions, each once however often it recorded the attempt,
    counted as learning counts teachers (``kb.learning.independent``: no two on one kernel
    shape or in one fleet; a session whose start the projection never saw is its own kernel).
    Notes are ranked first by that count over the sessions on a kernel whose shape a certified
    repair fixed — the attempt was a wrong turn beside a real fix, on a kernel that was really
    broken — then by the count over all their sessions, then by their text.
    """
    await _own_tables(store)
    async with store.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT f.summary, f.session_id, coalesce(s.origin, 'session:' || f.session_id) "
            "AS origin, EXISTS (SELECT 1 FROM kb_sessions c WHERE c.certified "
            "AND c.origin = s.origin) AS beside_a_fix "
            "FROM kb_failed_attempt_sessions f LEFT JOIN kb_sessions s USING (session_id) "
            "WHERE f.aimed_at = $1",
            f"{evidence.failure_class}|{evidence.category}",
        )
    seen: dict[str, list[tuple[tuple[str, str], bool]]] = {}
    for row in rows:
        pair = (fleet_of(row["session_id"]), row["origin"])
        seen.setdefault(row["summary"], []).append((pair, row["beside_a_fix"]))
    ranked = sorted(
        (
            -independent(pair for pair, beside in sessions if beside),
            -independent(pair for pair, _ in sessions),
            summary,
        )
        for summary, sessions in seen.items()
    )
    return [
        f"[tried before without success, {-count}x] {summary}"
        for _, count, summary in ranked[:MAX_FAILED_ATTEMPTS]
    ]


async def retrieve(
    store: EventStore, evidence: Evidence, budget_chars: int, held_out: str = ""
) -> tuple[list[Entry], list[Entry]]:
    """(promoted entries for the prompt, learned patches to try first at zero tokens).

    Patches include candidates still awaiting promotion: trying one costs no tokens, and the
    engine validates whatever it produces. They are those of the evidence's failure classes and
    platform: first the op's own category, then the other categories' — a patch applies only
    where its changed lines occur exactly once, so the same line in a kernel of another category
    (an activation in an elementwise op and in a matmul's epilogue) is fixed the same way. A
    patch that made this very kernel worse before (negative knowledge) is left out; so is, where
    ``held_out`` is a kernel's source, every entry written from that kernel's own code.
    """
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    entries = [e for e in await projection.entries() if not (held_out and e.hands_over(held_out))]
    promoted = [e for e in entries if e.status == "promoted"]
    learned = [e for e in entries if e.source == "learned" and e.status != "demoted"]
    harmful = await projection.harmful_patches(evidence.candidate_hash)
    patches = [
        e
        for e in learned
        if e.failure_class in [evidence.failure_class, *evidence.failure_classes]
        and e.platform in (evidence.platform, "any")
        and f"patch:{e.id}" not in harmful
    ]
    patches.sort(key=lambda e: e.category not in (evidence.category, "any"))  # stable
    return rank(promoted, evidence, budget_chars), patches


def search(
    entries: list[Entry],
    text: str,
    failure_class: str | None = None,
    category: str | None = None,
    limit: int = 10,
) -> list[Entry]:
    """Entries sharing the most words with ``text``, optionally of one class and category."""
    words = _words(text)
    hits = []
    for entry in entries:
        if failure_class and entry.failure_class != failure_class:
            continue
        if category and entry.category not in (category, "any"):
            continue
        body = entry.body
        entry_words = _words(
            " ".join(
                [entry.title, body.get("diagnosis", ""), body.get("guidance", "")]
                + body.get("keywords", [])
            )
        )
        share = len(words & entry_words) / len(words) if words else 1.0
        if share > 0:
            hits.append((share, entry))
    hits.sort(key=lambda hit: (-hit[0], hit[1].id))
    return [entry for _, entry in hits[:limit]]


async def stats(store: EventStore) -> dict[str, Any]:
    """What the knowledge base holds and how it has been used, by which sessions."""
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    entries = await projection.entries()
    async with store.pool.acquire() as conn:
        rows = await conn.fetch("SELECT entry_id, session_id FROM kb_session_uses ORDER BY 1, 2")
    sessions: dict[str, list[str]] = {}
    for row in rows:
        sessions.setdefault(row["entry_id"], []).append(row["session_id"])

    def count(attribute: str) -> dict[str, int]:
        tally: dict[str, int] = {}
        for entry in entries:
            key = getattr(entry, attribute)
            tally[key] = tally.get(key, 0) + 1
        return dict(sorted(tally.items()))

    learned = []
    for entry in entries:
        if entry.source != "learned":
            continue
        history = await store.read_stream(f"kb-{entry.id}")
        origins = [e.session_id for e in teachers(history)]
        learned.append({**entry.summary(), "learned_from": origins})
    return {
        "entries": len(entries),
        "by_status": count("status"),
        "by_source": count("source"),
        "by_failure_class": count("failure_class"),
        "uses": sum(e.uses for e in entries),
        "successes": sum(e.successes for e in entries),
        "failures": sum(e.failures for e in entries),
        "learned": learned,
        "used_entries": [
            {**e.summary(), "sessions": sessions.get(e.id, [])} for e in entries if e.uses
        ],
        "checkpoint": await projection.checkpoint(),
    }
