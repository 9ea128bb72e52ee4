"""The event log: ordered, idempotent under retries, conflicts refused — the contract run on a
real PostgreSQL and on the in-memory log the fast tests use, so the two cannot drift apart."""

from __future__ import annotations

import asyncio
import os
import uuid

import asyncpg
import pytest
from event_payloads import new_event, payload

from kb.events import EventConflict, EventStore, NewEvent, content_hash
from kb.memory import MemoryEventStore
from nearmiss.client.faults import (
    INFRASTRUCTURE,
    as_activity_error,
    is_infrastructure_error,
    retry_line,
)


def stream() -> str:
    return f"repair-{uuid.uuid4()}"


@pytest.fixture(params=["postgres", "memory"])
def log(request):
    """The event log under test: PostgreSQL's (this test's own database) or the memory one."""
    if request.param == "memory":
        return MemoryEventStore()
    return request.getfixturevalue("store")


async def test_events_append_in_order_with_global_positions(log):
    sid = stream()
    positions = await log.append(
        sid, 0, [new_event("RepairStarted", kernel="k"), new_event("EvidenceCollected")]
    )
    assert positions == sorted(positions) and len(set(positions)) == 2
    events = await log.read_stream(sid)
    assert [(e.version, e.type) for e in events] == [(1, "RepairStarted"), (2, "EvidenceCollected")]
    assert events[0].payload == payload("RepairStarted", kernel="k")
    assert await log.stream_version(sid) == 2


async def test_a_retried_append_records_nothing_twice(log):
    sid = stream()
    event = new_event("FixProposed", model="playbook", tokens={"input": 0})
    first = await log.append(sid, 0, [event])
    again = await log.append(sid, 0, [event])  # an activity retried after its append landed
    assert first == again
    assert len(await log.read_stream(sid)) == 1


async def test_a_different_event_at_a_taken_version_is_a_conflict(log):
    sid = stream()
    await log.append(sid, 0, [new_event("RepairStarted", kernel="a")])
    with pytest.raises(EventConflict):
        await log.append(sid, 0, [new_event("RepairStarted", kernel="b")])
    # The failed append left nothing half-written.
    assert [e.payload["kernel"] for e in await log.read_stream(sid)] == ["a"]


async def test_concurrent_writers_commit_positions_in_order(log):
    streams = [stream() for _ in range(8)]

    async def write(sid: str) -> None:
        for version in range(5):
            await log.append(sid, version, [new_event("CandidateValidated", round=version)])

    await asyncio.gather(*(write(s) for s in streams))
    mine = [e for e in await log.read_all(limit=100_000) if e.stream_id in streams]
    assert len(mine) == 40
    for sid in streams:
        assert [e.payload["round"] for e in mine if e.stream_id == sid] == list(range(5))


async def test_a_batch_is_written_in_version_order_and_a_retried_one_only_adds_what_is_new(log):
    sid = stream()
    batch = [new_event("ToolCalled", round=n, summary="é" * n) for n in range(50)]
    positions = await log.append(sid, 0, batch)
    assert positions == sorted(positions) and len(set(positions)) == 50
    # A retry of the last 10 with one more event: the 10 keep their positions, one is added.
    more = batch[40:] + [new_event("ToolCalled", round=50)]
    again = await log.append(sid, 40, more)
    assert again[:10] == positions[40:] and again[10] > positions[-1]
    events = await log.read_stream(sid)
    assert [e.payload["round"] for e in events] == list(range(51))
    assert [e.position for e in events] == sorted(e.position for e in events)


async def test_a_batch_with_one_conflicting_event_writes_none_of_it(log):
    sid = stream()
    await log.append(sid, 0, [new_event("RepairStarted", kernel="a")])
    batch = [new_event("RepairStarted", kernel="a"), new_event("EvidenceCollected")]
    batch.append(new_event("FixProposed"))
    with pytest.raises(EventConflict, match="v1 holds RepairStarted"):
        await log.append(sid, 0, [new_event("RepairStarted", kernel="b"), *batch[1:]])
    assert len(await log.read_stream(sid)) == 1
    assert len(await log.append(sid, 0, batch)) == 3  # the same batch, right, goes in whole


async def test_blobs_are_stored_once_by_content_hash(log):
    source = b"def kernel(x):\n    return x\n"
    digest = await log.put_blob(source)
    assert digest == content_hash(source) == await log.put_blob(source)
    assert await log.get_blob(digest) == source
    with pytest.raises(KeyError):
        await log.get_blob(content_hash(b"never stored"))


def test_unknown_event_types_are_refused():
    with pytest.raises(ValueError, match="unknown event type"):
        NewEvent("SomethingHappened", {})


async def test_a_checkout_lives_in_a_scratch_directory_that_names_its_owner_and_goes(log):
    spec, candidate = await log.put_blob(b"SPEC = 1\n"), await log.put_blob(b"k = 2\n")
    async with log.checkout(spec, candidate, "kernel.py", "check") as (spec_path, cand_path):
        folder = spec_path.parent.parent
        assert cand_path.read_text() == "k = 2\n" and cand_path.parent.parent == folder
        assert folder.name.startswith(f"nearmiss-check-p{os.getpid()}s")
    assert not folder.exists()


async def test_a_candidate_named_like_the_spec_is_checked_against_the_spec(log):
    # Before, a candidate named spec.py was written over the spec in the same folder: every
    # check of its repair then judged it by the SPEC it defined itself.
    spec, candidate = await log.put_blob(b"SPEC = 1\n"), await log.put_blob(b"SPEC = 'mine'\n")
    async with log.checkout(spec, candidate, "spec.py", "check") as (spec_path, cand_path):
        assert spec_path.read_text() == "SPEC = 1\n"
        assert cand_path.read_text() == "SPEC = 'mine'\n" and cand_path.name == "spec.py"
    with pytest.raises(ValueError, match="not a file name"):
        async with log.checkout(spec, candidate, "../spec.py", "check"):
            pass


async def test_the_database_going_away_is_the_infrastructure_and_a_bug_is_not(postgres_cluster):
    from conftest import free_port

    closed = postgres_cluster.rsplit("@", 1)[0] + f"@127.0.0.1:{free_port()}/nearmiss"
    with pytest.raises(OSError) as refused:
        await EventStore.connect(closed)
    assert is_infrastructure_error(refused.value)
    try:
        raise RuntimeError("while storing") from refused.value
    except RuntimeError as wrapped:
        assert is_infrastructure_error(wrapped)  # raised from a refused connection
    for bug in (KeyError("sha256:0"), EventConflict("v2"), TypeError("x"), FileNotFoundError(2)):
        assert not is_infrastructure_error(bug)
    assert is_infrastructure_error(asyncpg.CannotConnectNowError("starting up"))


def test_activity_failures_are_sorted_retry_for_the_infrastructure_at_once_for_bugs():
    from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

    from workflows.retries import INFRA_ATTEMPTS, OTHER_ATTEMPTS, infra_retry

    infra = as_activity_error(ConnectionRefusedError(111, "Connect call failed"), attempt=7)
    assert infra.type == INFRASTRUCTURE and not infra.non_retryable
    bug = as_activity_error(KeyError("sha256:0"), attempt=1)
    assert bug.type == "KeyError" and bug.non_retryable
    chosen = ApplicationError("no", type="UsageError", non_retryable=True)
    assert as_activity_error(chosen, attempt=1) is chosen
    rate_limited = ApplicationError("429", type="FixerRetry")
    retried = as_activity_error(rate_limited, attempt=OTHER_ATTEMPTS - 1)
    assert retried.type == "FixerRetry" and retried.message == "429"
    assert not retried.non_retryable
    # Benign: the SDK logs it without a traceback; the worker says it in one line.
    assert retried.category == ApplicationErrorCategory.BENIGN
    line = retry_line(retried, OTHER_ATTEMPTS - 1)
    assert line == f"429; retrying in 16 s (attempt {OTHER_ATTEMPTS}/{OTHER_ATTEMPTS})"
    spent = as_activity_error(rate_limited, attempt=OTHER_ATTEMPTS)
    assert spent.type == "FixerRetry" and spent.non_retryable
    assert retry_line(spent, OTHER_ATTEMPTS) == f"429 (gave up after {OTHER_ATTEMPTS} attempts)"
    policy = infra_retry("UsageError")
    waited = sum(
        min(policy.initial_interval.total_seconds() * 2**i, policy.maximum_interval.seconds)
        for i in range(INFRA_ATTEMPTS - 1)
    )
    assert policy.maximum_attempts == INFRA_ATTEMPTS and 600 <= waited <= 660  # ten minutes
    assert policy.non_retryable_error_types == ["UsageError"]


async def test_what_a_reader_gets_is_a_copy_and_heads_and_types_read_the_newest(log):
    sid, other = stream(), stream()
    written = payload("RepairStarted", kernel="k", targets=["interpret", "tpu-v5e"])
    await log.append(sid, 0, [NewEvent("RepairStarted", written)])
    written["kernel"] = "changed after the append"
    read = await log.read_stream(sid)
    read[0].payload["targets"].append("gpu")
    assert (await log.read_stream(sid))[0].payload == payload(
        "RepairStarted", kernel="k", targets=["interpret", "tpu-v5e"]
    )
    await log.append(sid, 1, [new_event("RepairFinished", certified=True)])
    await log.append(other, 0, [new_event("RepairFinished", certified=False)])
    heads = await log.heads([sid, other, stream()])
    assert {k: (e.version, e.payload["certified"]) for k, e in heads.items()} == {
        sid: (2, True),
        other: (1, False),
    }
    newest = await log.recent_of_type("RepairFinished", limit=2)
    assert [e.stream_id for e in newest] == [other, sid]
    assert [e.version for e in await log.read_stream(sid, after_version=1)] == [2]
    assert await log.stream_version(stream()) == 0


# --- each part of the schema has an owner -----------------------------------------------------


async def test_the_knowledge_projection_owns_its_tables(store):
    """The log's schema is the log's; the projection's tables appear when it is first used."""
    from kb.knowledge import KNOWLEDGE_SCHEMA, KnowledgeProjection

    async with store.pool.acquire() as conn:
        assert await conn.fetchval("SELECT to_regclass('kb_entries')") is None
        await store.append(stream(), 0, [new_event("RepairStarted", kernel="k")])
        assert await KnowledgeProjection(store).catch_up() == 1
        assert await conn.fetchval("SELECT to_regclass('kb_entries')") is not None
        owners = dict(await conn.fetch("SELECT owner, version FROM schema_versions"))
    assert owners == {"log": 2, "knowledge": len(KNOWLEDGE_SCHEMA)}


@pytest.mark.parametrize("old_version", [4, 5])
async def test_a_database_from_before_owners_is_carried_over_without_reapplying(
    postgres_dsn, old_version
):
    """One numbered list held every table once (schema_migrations 1..5: events, knowledge,
    failed attempts, harmful patches, append_events). Such a database keeps its data, nothing
    is created twice (that would fail), and what it lacked is added."""
    from kb.events import MIGRATIONS
    from kb.knowledge import KNOWLEDGE_SCHEMA, KnowledgeProjection

    old_order = [MIGRATIONS[0], *KNOWLEDGE_SCHEMA[:3], MIGRATIONS[1]][:old_version]
    conn = await asyncpg.connect(postgres_dsn)
    try:
        for statement in old_order:
            await conn.execute(statement)
        await conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)")
        for version in range(1, old_version + 1):
            await conn.execute("INSERT INTO schema_migrations VALUES ($1)", version)
        await conn.execute(
            "INSERT INTO events (stream_id, version, type, payload) "
            "VALUES ('repair-old', 1, 'RepairStarted', '{}')"
        )
    finally:
        await conn.close()
    store = await EventStore.connect(postgres_dsn)
    try:
        await store.append("repair-old", 1, [new_event("RepairFinished", certified=True)])
        assert [e.type for e in await store.read_stream("repair-old")] == [
            "RepairStarted",
            "RepairFinished",
        ]
        assert await KnowledgeProjection(store).catch_up() == 2
        async with store.pool.acquire() as conn:
            owners = dict(await conn.fetch("SELECT owner, version FROM schema_versions"))
            assert await conn.fetchval("SELECT to_regclass('schema_migrations')") is None
    finally:
        await store.close()
    assert owners == {"log": 2, "knowledge": len(KNOWLEDGE_SCHEMA)}
