"""Negative knowledge ranked by its evidence, on a real PostgreSQL: what the fix prompt's
"tried before without success" lines (kb.knowledge.failed_attempts) put first is what the most
independent sessions saw fail — one session, one kernel or one fleet repeating an attempt is one
witness — and a wrong turn beside a certified fix of the same kernel comes before the rest."""

from __future__ import annotations

import asyncpg
from event_payloads import filled_event
from test_knowledge import evidence
from test_learning import BUGGY, session

from kb.events import EventStore, migrate
from kb.knowledge import KNOWLEDGE_SCHEMA, PROJECTION, KnowledgeProjection, failed_attempts
from workflows.fleet import FleetMember, member_session_id

AIMED_AT = "wrong_values|attention"
EVIDENCE = evidence(failure_class="wrong_values", category="attention")
# Kernels that differ in what they do (each imports something else): each is another shape.
KERNELS = [f"import {module}\n\n\n" + BUGGY for module in ("math", "os", "sys", "json", "re")]
# The first kernel as its author might send it again: documented, renamed, re-spaced.
DISGUISED = [
    '"""A body."""\n' + KERNELS[0].replace("o_ref", "out_ref"),
    KERNELS[0].replace("x_ref", "in_ref").replace(" * ", "*"),
    KERNELS[0] + "# reviewed\n",
]


def member(fleet_id: str, index: int) -> str:
    fields = {"name": "k", "spec_hash": "s", "candidate_hash": "c", "candidate_name": "k.py"}
    return member_session_id(fleet_id, index, FleetMember(kernel="attention", **fields))


def tried(summary: str, times: int = 1, outcome: str = "same") -> list:
    """A fix validated ``times`` times as no help against the failure."""
    fields = {"outcome": outcome, "summary": summary, "aimed_at": AIMED_AT}
    return [filled_event("CandidateValidated", {"round": n, **fields}) for n in range(times)]


async def record(store, sid: str, kernel: str, events: list) -> None:
    """A session that started from ``kernel`` and recorded ``events``."""
    original = await store.put_blob(kernel.encode())
    started = filled_event("RepairStarted", {"candidate_hash": original})
    await store.append(sid, 0, [started, *events])


async def lines(store) -> list[str]:
    await KnowledgeProjection(store).catch_up()
    return await failed_attempts(store, EVIDENCE)


WITNESSED_TWICE = "[tried before without success, 2x] scale by d"
ONE_WITNESS = "[tried before without success, 1x] add an epsilon"


async def two_independent_sessions(store) -> None:
    await record(store, "repair-attention-one", KERNELS[1], tried("scale by d"))
    await record(store, "repair-attention-two", KERNELS[2], tried("scale by d"))


async def test_one_session_repeating_an_attempt_is_one_witness(store):
    await two_independent_sessions(store)
    await record(store, "repair-attention-loud", KERNELS[0], tried("add an epsilon", times=6))
    assert await lines(store) == [WITNESSED_TWICE, ONE_WITNESS]
    # Read again from the start (a replayed batch): nothing is counted twice.
    async with store.pool.acquire() as conn:
        await conn.execute("UPDATE projection_checkpoints SET position = 0")
    assert await lines(store) == [WITNESSED_TWICE, ONE_WITNESS]


async def test_sessions_on_one_kernel_however_disguised_are_one_witness(store):
    await two_independent_sessions(store)
    for n, kernel in enumerate([KERNELS[0], *DISGUISED]):
        await record(store, f"repair-attention-copy{n}", kernel, tried("add an epsilon"))
    assert await lines(store) == [WITNESSED_TWICE, ONE_WITNESS]


async def test_members_of_one_fleet_on_different_kernels_are_one_witness(store):
    await two_independent_sessions(store)
    for n, kernel in enumerate(KERNELS):
        await record(store, member("fleet-x", n), kernel, tried("add an epsilon"))
    assert await lines(store) == [WITNESSED_TWICE, ONE_WITNESS]
    # Members of two fleets on two kernels are two.
    await record(store, member("fleet-y", 0), KERNELS[1], tried("add an epsilon"))
    assert await lines(store) == [
        "[tried before without success, 2x] add an epsilon",
        "[tried before without success, 2x] scale by d",
    ]


async def test_a_wrong_turn_beside_a_certified_fix_of_its_kernel_comes_first(store):
    await two_independent_sessions(store)
    await record(store, "repair-attention-beside", KERNELS[0], tried("add an epsilon"))
    await record(store, "repair-attention-doubt", KERNELS[3], tried("clamp the scores"))
    # A certified repair of the first kernel (renamed): the epsilon was a wrong turn there.
    await session(store, DISGUISED[1], DISGUISED[1].replace("1.0 / d", "1.0 / math.sqrt(d)"))
    # A repair of the other kernel that an integrity violation spoils vouches for nothing.
    fixed = KERNELS[3].replace("1.0 / d", "1.0 / math.sqrt(d)")
    await session(store, KERNELS[3], fixed, integrity=True)
    assert await lines(store) == [
        ONE_WITNESS,
        WITNESSED_TWICE,
        "[tried before without success, 1x] clamp the scores",
    ]


async def test_a_database_from_before_reads_its_old_sessions_again_for_their_evidence(
    postgres_dsn,
):
    """A knowledge projection that had read the log before sessions' evidence was kept: its
    tables gain it from the events it had read, and it goes on from its checkpoint."""
    store = await EventStore.connect(postgres_dsn)
    try:
        async with store.pool.acquire() as conn:
            await migrate(conn, PROJECTION, KNOWLEDGE_SCHEMA[:3])
            await two_independent_sessions(store)
            await record(store, "repair-attention-loud", KERNELS[0], tried("add an epsilon", 6))
            await session(store, DISGUISED[2], DISGUISED[2].replace("1.0 / d", "1.0 / 2"))
            # Where the projection of then had got to, and the counts it kept.
            last = await conn.fetchval("SELECT max(position) FROM events")
            await conn.execute(
                "INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2)",
                PROJECTION,
                last,
            )
            await conn.execute(
                "INSERT INTO kb_failed_attempts (aimed_at, summary, times) VALUES "
                "($1, 'add an epsilon', 6), ($1, 'scale by d', 2)",
                AIMED_AT,
            )
    finally:
        await store.close()
    store = await EventStore.connect(postgres_dsn)
    try:
        # Nothing new to read after the checkpoint; the old events are read for evidence.
        assert await KnowledgeProjection(store).catch_up() == 0
        assert await failed_attempts(store, EVIDENCE) == [ONE_WITNESS, WITNESSED_TWICE]
        async with store.pool.acquire() as conn:
            versions = dict(await conn.fetch("SELECT owner, version FROM schema_versions"))
            assert versions[PROJECTION] == len(KNOWLEDGE_SCHEMA)
            assert await conn.fetchval("SELECT count(*) FROM kb_rereads") == 0
        # What comes after is read as usual.
        await record(store, "repair-attention-three", KERNELS[4], tried("scale by d"))
        assert await lines(store) == [ONE_WITNESS, "[tried before without success, 3x] scale by d"]
    finally:
        await store.close()


async def test_a_new_database_has_nothing_to_read_again(postgres_dsn):
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await migrate(conn)
        await migrate(conn, PROJECTION, KNOWLEDGE_SCHEMA)
        assert await conn.fetchval("SELECT count(*) FROM kb_rereads") == 0
    finally:
        await conn.close()
