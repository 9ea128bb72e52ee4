"""The knowledge base on a real PostgreSQL: seed as events, projection, retrieval, search."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from event_payloads import filled_event

from kb.knowledge import (
    SEED_DIR,
    Entry,
    KnowledgeProjection,
    failed_attempts,
    load_seed,
    rank,
    search,
    seed_entries,
)
from nearmiss.engine.models import FAILURE_CLASSES, Evidence


def entry(tag: str, failure_class="nan_inf", category="matmul", platform="any", **body):
    return {
        "id": f"test-{tag}",
        "title": body.pop("title", f"entry {tag}"),
        "signature": {"failure_class": failure_class, "category": category, "platform": platform},
        "bug_family": "missing_accumulator_init",
        "diagnosis": body.pop("diagnosis", "NaN everywhere: the accumulator was never zeroed"),
        "guidance": body.pop("guidance", "zero it under pl.when(pl.program_id(2) == 0)"),
        "example": "",
        "keywords": body.pop("keywords", ["NaN", "accumulator"]),
    }


def write_seed(tmp_path, entries) -> None:
    (tmp_path / "seed.json").write_text(json.dumps(entries))


def evidence(**kw) -> Evidence:
    return Evidence(
        candidate_hash="sha256:x",
        suite="compact",
        certified=False,
        failure_class=kw.pop("failure_class", "nan_inf"),
        category=kw.pop("category", "matmul"),
        platform=kw.pop("platform", "cpu"),
        diagnosis=kw.pop("diagnosis", "16384 NaN where the reference is finite (accumulator)"),
        **kw,
    )


def test_the_shipped_seed_covers_every_failure_class():
    entries = seed_entries(SEED_DIR)
    assert len({e["id"] for e in entries}) == len(entries) >= 20
    assert {e["signature"]["failure_class"] for e in entries} == FAILURE_CLASSES


async def test_seed_loading_is_idempotent_and_a_changed_seed_is_a_revision(store, tmp_path):
    tag = uuid.uuid4().hex[:8]
    write_seed(tmp_path, [entry(tag)])
    assert await load_seed(store, tmp_path) == 1
    assert await load_seed(store, tmp_path) == 0
    write_seed(tmp_path, [entry(tag, title="revised title")])
    assert await load_seed(store, tmp_path) == 1
    events = await store.read_stream(f"kb-test-{tag}")
    assert [e.type for e in events] == ["KnowledgeAdded", "KnowledgeRevised"]
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    assert (await projection.entry(f"test-{tag}")).title == "revised title"


async def test_uses_successes_and_failures_follow_the_sessions_that_retrieved_an_entry(
    store, tmp_path
):
    tag = uuid.uuid4().hex[:8]
    write_seed(tmp_path, [entry(tag)])
    await load_seed(store, tmp_path)
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    for certified in (True, False, True):
        session = f"repair-test-{uuid.uuid4().hex[:8]}"
        retrieved = filled_event("KnowledgeRetrieved", {"round": 1, "entry_ids": [f"test-{tag}"]})
        again = filled_event("KnowledgeRetrieved", {"round": 2, "entry_ids": [f"test-{tag}"]})
        finished = filled_event("RepairFinished", {"certified": certified})
        await store.append(session, 0, [retrieved, again, finished])
    # A projection started afresh (a restart) resumes from the checkpoint, not from zero.
    before = await projection.checkpoint()
    restarted = KnowledgeProjection(store)
    assert await restarted.catch_up() >= 9
    assert await restarted.checkpoint() > before
    used = await restarted.entry(f"test-{tag}")
    assert (used.uses, used.successes, used.failures) == (3, 2, 1)  # one use per session


async def test_concurrent_catch_ups_apply_each_event_once(store, tmp_path):
    tag = uuid.uuid4().hex[:8]
    write_seed(tmp_path, [entry(tag)])
    await load_seed(store, tmp_path)
    await KnowledgeProjection(store).catch_up()
    for _ in range(20):
        session = f"repair-test-{uuid.uuid4().hex[:8]}"
        await store.append(
            session,
            0,
            [
                filled_event("KnowledgeRetrieved", {"entry_ids": [f"test-{tag}"]}),
                filled_event("RepairFinished", {"certified": True}),
            ],
        )
    await asyncio.gather(*(KnowledgeProjection(store).catch_up() for _ in range(4)))
    used = await KnowledgeProjection(store).entry(f"test-{tag}")
    assert (used.uses, used.successes) == (20, 20)


def _entry(tag, failure_class="nan_inf", category="matmul", platform="any", **kw) -> Entry:
    body = entry(tag, failure_class, category, platform, **kw)
    return Entry(
        id=body["id"],
        status="promoted",
        source="seed",
        title=body["title"],
        failure_class=failure_class,
        category=category,
        platform=platform,
        body=body,
        uses=kw.get("uses", 0),
    )


def test_retrieval_ranks_by_signature_then_words_and_fits_the_budget():
    exact = _entry("exact")
    any_category = _entry("any", category="any")
    other_words = _entry("words", diagnosis="grid rounding", keywords=["cdiv"])
    secondary = _entry("secondary", failure_class="wrong_values")
    wrong_platform = _entry("tpu", platform="tpu")
    wrong_category = _entry("attention", category="attention")
    unrelated = _entry("unrelated", failure_class="timeout")
    entries = [unrelated, wrong_platform, secondary, other_words, any_category, exact]
    entries.append(wrong_category)
    ev = evidence(failure_classes=["nan_inf", "wrong_values"])
    ranked = [e.id for e in rank(entries, ev, budget_chars=100_000)]
    assert ranked == ["test-exact", "test-words", "test-any", "test-secondary"]
    one = rank(entries, ev, budget_chars=len(exact.line()) + 1)
    assert [e.id for e in one] == ["test-exact"]


def test_search_finds_entries_by_the_words_of_an_error():
    entries = [_entry("a", keywords=["swap", "dtype"]), _entry("b", keywords=["cdiv", "grid"])]
    assert [e.id for e in search(entries, "Invalid dtype for swap")] == ["test-a"]
    assert search(entries, "grid", failure_class="timeout") == []


async def test_an_entry_whose_use_goes_with_failures_is_demoted(store, tmp_path):
    tag = uuid.uuid4().hex[:8]
    write_seed(tmp_path, [entry(tag)])
    await load_seed(store, tmp_path)
    for _ in range(3):
        await store.append(
            f"repair-test-{uuid.uuid4().hex[:8]}",
            0,
            [
                filled_event("KnowledgeRetrieved", {"entry_ids": [f"test-{tag}"]}),
                filled_event("RepairFinished", {"certified": False}),
            ],
        )
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    demoted = await projection.entry(f"test-{tag}")
    assert (demoted.status, demoted.failures) == ("demoted", 3)
    assert demoted.id not in [e.id for e in await projection.entries(status="promoted")]


async def test_a_gap_in_the_global_position_is_passed_over(store, tmp_path):
    tag = uuid.uuid4().hex[:8]
    write_seed(tmp_path, [entry(tag)])
    await load_seed(store, tmp_path)
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    # A rolled-back append consumes a position for good.
    with pytest.raises(RuntimeError):
        async with store.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO events (stream_id, version, type, payload) "
                "VALUES ('rolled-back', 1, 'RepairStarted', '{}'::jsonb)"
            )
            raise RuntimeError("abort")
    session = f"repair-test-{uuid.uuid4().hex[:8]}"
    await store.append(
        session, 0, [filled_event("KnowledgeRetrieved", {"entry_ids": [f"test-{tag}"]})]
    )
    assert await projection.catch_up() == 1
    assert (await projection.entry(f"test-{tag}")).uses == 1


async def test_fixes_that_did_not_help_become_negative_knowledge_for_their_failure(store):
    aimed_at = f"wrong_values|test-{uuid.uuid4().hex[:8]}"
    session = f"repair-test-{uuid.uuid4().hex[:8]}"
    outcomes = ["same", "regression_reverted", "improved"]
    await store.append(
        session,
        0,
        [
            filled_event(
                "CandidateValidated",
                {"round": n, "outcome": outcome, "summary": f"fix {n % 2}", "aimed_at": aimed_at},
            )
            for n, outcome in enumerate(outcomes)
        ],
    )
    await KnowledgeProjection(store).catch_up()
    ev = evidence(failure_class="wrong_values", category=aimed_at.split("|")[1])
    lines = await failed_attempts(store, ev)
    assert lines == [
        "[tried before without success, 1x] fix 0",
        "[tried before without success, 1x] fix 1",
    ]
