"""RepairWorkflow end to end: real Temporal, real PostgreSQL, the real openai client talking to
the fake OpenAI-compatible server; real checks of real kernels."""

from __future__ import annotations

import logging

import pytest
from fake_openai import FakeOpenAI, answer, rate_limited, unauthorized
from sessions import full_file, run_session

from conftest import OPS
from workflows.loop import Guards
from workflows.repair import KERNEL_ATTRIBUTE, TOKENS_ATTRIBUTE, VERDICT_ATTRIBUTE

SOFTMAX = OPS / "softmax_rows"
GOLDEN = (SOFTMAX / "golden.py").read_text()
FLOOR_GRID = SOFTMAX / "variants" / "floor_grid.py"
UNSTABLE = (SOFTMAX / "variants" / "no_max_subtraction.py").read_text()


async def repair(client, store, fake, guards=None, candidate=FLOOR_GRID, use_kb=True):
    """A session on the softmax spec; the tests' store has the seed knowledge, as installed."""
    return await run_session(client, store, fake, SOFTMAX / "spec.py", candidate, guards, use_kb)


def types(events) -> list[str]:
    return [e.type for e in events]


async def test_a_two_round_repair_certifies_with_exact_tokens_and_one_event_per_step(
    client, seeded_store
):
    with FakeOpenAI() as fake:
        fake.script(
            answer(
                full_file(UNSTABLE), prompt_tokens=1000, completion_tokens=300, cached_tokens=600
            ),
            answer(full_file(GOLDEN), prompt_tokens=1200, completion_tokens=250, cached_tokens=900),
        )
        result, events, progress, attributes = await repair(client, seeded_store, fake)
        prompts = [r["messages"][-1]["content"] for r in fake.requests]
    assert result.certified and result.rounds == 2 and result.stop_reason == "certified"
    assert result.tokens.model_dump() == {"input": 2200, "cached_input": 1500, "output": 550}
    assert (await seeded_store.get_blob(result.final_hash)).decode() == GOLDEN
    assert types(events)[0] == "RepairStarted" and types(events)[-1] == "RepairFinished"
    assert types(events).count("FixProposed") == 2
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    fixes = [e.payload for e in events if e.type == "FixProposed"]
    assert sum(f["tokens"]["input"] for f in fixes) == 2200
    # The model saw the evidence: round 1 the ragged-tail failure, round 2 the unstable one,
    # each with the knowledge entries retrieved for it (recorded before each fix).
    assert "boundary" in prompts[0] and "unstable" in prompts[1]
    retrieved = [e.payload for e in events if e.type == "KnowledgeRetrieved"]
    assert [r["round"] for r in retrieved] == [1, 2] and all(r["entry_ids"] for r in retrieved)
    for prompt, record in zip(prompts, retrieved, strict=True):
        assert all(f"[{entry_id}]" in prompt for entry_id in record["entry_ids"])
    # Prompts and answers are kept by content hash.
    assert (await seeded_store.get_blob(fixes[0]["response_hash"])).decode() == full_file(UNSTABLE)
    # Live progress is queryable, and the session can be found by kernel, verdict and tokens.
    assert progress.phase == "stop" and progress.round == 2 and progress.tokens.total == 2750
    assert attributes.get(KERNEL_ATTRIBUTE) == "softmax_rows"
    assert attributes.get(VERDICT_ATTRIBUTE) == "certified"
    assert attributes.get(TOKENS_ATTRIBUTE) == 2750


async def test_a_rate_limit_is_retried_by_temporal_and_the_repair_goes_on(
    client, seeded_store, caplog
):
    caplog.set_level(logging.DEBUG)
    with FakeOpenAI() as fake:
        fake.script(rate_limited(retry_after="1"), answer(full_file(GOLDEN), prompt_tokens=10))
        result, events, *_ = await repair(client, seeded_store, fake, use_kb=False)
        assert len(fake.requests) == 2
        prompt = fake.requests[-1]["messages"][-1]["content"]
    assert result.certified and result.tokens.input == 10  # the refused call cost nothing
    # The retry is said in one line, without a traceback.
    said = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None, [r.getMessage() for r in said]
    assert "model endpoint answered 429" in said[0].getMessage()
    assert "retrying in 1 s (attempt 2/" in said[0].getMessage()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    # The no-knowledge ablation: nothing retrieved, nothing in the prompt.
    assert "KnowledgeRetrieved" not in [e.type for e in events] and "[seed-" not in prompt


async def test_a_non_retryable_model_error_stops_cleanly(client, seeded_store):
    with FakeOpenAI() as fake:
        fake.script(unauthorized())
        result, events, *_ = await repair(client, seeded_store, fake)
        assert len(fake.requests) == 1  # not retried
    assert not result.certified and result.stop_reason == "fixer_error"
    assert "401" in result.stop_detail or "API key" in result.stop_detail
    assert types(events)[-1] == "RepairFinished"


@pytest.mark.parametrize(
    ("guards", "script", "reason"),
    [
        (Guards(max_rounds=1), [answer(full_file(UNSTABLE))], "max_rounds"),
        (
            Guards(token_budget=500),
            [answer(full_file(UNSTABLE), prompt_tokens=600)],
            "token_budget",
        ),
        (
            Guards(token_budget=None, uncached_token_budget=300),
            [answer(full_file(UNSTABLE), prompt_tokens=1000, cached_tokens=600)],
            "uncached_token_budget",
        ),
        (
            Guards(no_progress_rounds=2),
            [answer("<<<<<<< SEARCH\nnot in the file\n=======\nx = 1\n>>>>>>> REPLACE\n")] * 2,
            "no_progress",
        ),
        (Guards(deadline_s=0.5), [], "deadline"),
    ],
    ids=["max_rounds", "token_budget", "uncached", "no_progress", "deadline"],
)
async def test_each_guard_stops_a_repair_with_its_reason(
    client, seeded_store, guards, script, reason
):
    with FakeOpenAI() as fake:
        fake.script(*script)
        result, events, *_ = await repair(client, seeded_store, fake, guards)
    assert not result.certified and result.stop_reason == reason, result.stop_detail
    tripped = [e.payload for e in events if e.type == "GuardTripped"]
    assert [t["guard"] for t in tripped] == [reason]
    assert types(events)[-1] == "RepairFinished"


async def test_a_candidate_seen_before_stops_the_repair_as_a_cycle(client, seeded_store, tmp_path):
    # A kernel that does not compile → floor_grid (better: only the ragged tail fails) → the
    # broken kernel again.
    broken = tmp_path / "softmax_arity.py"
    broken.write_text(GOLDEN.replace("lambda i: (i, 0)", "lambda i, j: (i, 0)"))
    with FakeOpenAI() as fake:
        floor = answer(full_file(FLOOR_GRID.read_text()))
        fake.script(floor, answer(full_file(broken.read_text())))
        result, events, *_ = await repair(client, seeded_store, fake, candidate=broken)
    assert result.stop_reason == "cycle" and result.rounds == 2
    assert [e.payload["guard"] for e in events if e.type == "GuardTripped"] == ["cycle"]
    # The best candidate so far is kept: the floor-grid one, not the original.
    assert (await seeded_store.get_blob(result.final_hash)).decode() == FLOOR_GRID.read_text()
