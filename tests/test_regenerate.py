"""The regenerate baseline end to end: real Temporal, real PostgreSQL, the real openai client
talking to the fake endpoint, real checks of the kernels the "model" wrote."""

from __future__ import annotations

import uuid

import pytest
from fake_openai import FakeOpenAI, answer, unauthorized
from sessions import full_file
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from activities.regenerate import build_messages, spec_fields
from conftest import OPS
from nearmiss.client.service import build_worker
from workflows.regenerate import GenerateInput, RegenerateRequest, RegenerateWorkflow
from workflows.repair import TASK_QUEUE

SOFTMAX = OPS / "softmax_rows"
SPEC = (SOFTMAX / "spec.py").read_text()
GOLDEN = (SOFTMAX / "golden.py").read_text()
FLOOR_GRID = (SOFTMAX / "variants" / "floor_grid.py").read_text()


@pytest.fixture
def fake(monkeypatch):
    """The fake endpoint, found by the worker's generator the way a user configures one."""
    with FakeOpenAI() as server:
        monkeypatch.setenv("NEARMISS_OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("NEARMISS_OPENAI_API_KEY", "test-key")
        yield server


async def regenerate(client, store, trials: int, model: str = "openai:fake-model"):
    """(result, the session's events, its workflow handle)."""
    request = RegenerateRequest(
        spec_hash=await store.put_blob(SPEC.encode()),
        kernel="softmax_rows",
        candidate_name="softmax_rows.py",
        model=model,
        trials=trials,
        seed=40,
    )
    session = f"regenerate-test-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, store, fail_workflows_on_error=True):
        handle = await client.start_workflow(
            RegenerateWorkflow.run, request, id=session, task_queue=TASK_QUEUE
        )
        result = await handle.result()
    return result, await store.read_stream(session), handle


async def test_three_trials_give_pass_at_1_of_a_third_and_pass_at_3(client, store, fake):
    fake.script(
        answer(full_file(GOLDEN), prompt_tokens=1000, completion_tokens=400, cached_tokens=200),
        answer(full_file(FLOOR_GRID), prompt_tokens=1000, completion_tokens=380),
        answer("I would tile the rows, but I am not sure how.", prompt_tokens=1000),
    )
    result, events, handle = await regenerate(client, store, trials=3)
    assert result.pass_at_1 == pytest.approx(1 / 3) and result.pass_at_k is True
    assert result.tokens.model_dump() == {"input": 3000, "cached_input": 200, "output": 800}
    # Trials run concurrently, so which trial drew which answer is not fixed: judge each by it.
    golden_hash = await store.put_blob(GOLDEN.encode())
    broken_hash = await store.put_blob(FLOOR_GRID.encode())
    by_hash = {t.candidate_hash: t for t in result.trials}
    assert by_hash[golden_hash].certified and by_hash[golden_hash].failure_class is None
    assert not by_hash[broken_hash].certified
    assert by_hash[broken_hash].failure_class == "boundary"
    assert "no ```python block" in by_hash[None].reason
    assert sorted(t.trial for t in result.trials) == [1, 2, 3]

    types = [e.type for e in events]
    assert types[0] == "RegenerateStarted" and types[-1] == "RegenerateFinished"
    assert types.count("KernelGenerated") == 3 and types.count("EvidenceCollected") == 2
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    generated = [e.payload for e in events if e.type == "KernelGenerated"]
    assert sum(g["tokens"]["output"] for g in generated) == 800
    for g in generated:  # prompts and answers are kept by content hash
        assert "Numerically stable softmax" in (await store.get_blob(g["prompt_hash"])).decode()
        assert g["response_hash"]
    evidence = [e.payload for e in events if e.type == "EvidenceCollected"]
    assert {e["suite"] for e in evidence} == {"all"} and {e["phase"] for e in evidence} == {
        "regenerate"
    }
    finished = events[-1].payload
    assert finished["pass_at_1"] == pytest.approx(1 / 3) and finished["pass_at_k"] is True
    assert finished["tokens"] == result.tokens.model_dump()
    # Independent samples: sampling on, a distinct seed per trial, the spec in the prompt.
    assert sorted(r["seed"] for r in fake.requests) == [41, 42, 43]
    assert {r["temperature"] for r in fake.requests} == {0.7}
    assert all("def reference" in r["messages"][0]["content"] for r in fake.requests)
    # The history replays against today's code (determinism of the concurrent trials).
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[RegenerateWorkflow], data_converter=pydantic_data_converter)
    assert (await replayer.replay_workflow(history)).replay_failure is None


async def test_a_model_error_fails_its_trial_not_the_session(client, store, fake):
    fake.script(unauthorized(), answer("No code today.", prompt_tokens=70, completion_tokens=5))
    result, events, _ = await regenerate(client, store, trials=2)
    assert result.pass_at_1 == 0 and result.pass_at_k is False
    assert result.tokens.model_dump() == {"input": 70, "cached_input": 0, "output": 5}
    reasons = sorted(t.reason for t in result.trials)
    assert "401" in reasons[1] and "the model failed" in reasons[1]
    assert len(fake.requests) == 2  # a 401 is not retried
    assert [e.type for e in events].count("EvidenceCollected") == 0


async def test_the_playbook_cannot_regenerate(client, store):
    with pytest.raises(WorkflowFailureError) as info:
        await regenerate(client, store, trials=1, model="playbook")
    assert info.value.cause.type == "UsageError"
    assert "cannot write a kernel" in str(info.value.cause)


def test_the_prompt_is_filled_from_the_spec_without_importing_it():
    assert spec_fields(SPEC) == {
        "name": "softmax_rows",
        "category": "reduction",
        "description": "Numerically stable softmax over the last axis.",
    }
    request = GenerateInput(
        spec_hash="sha256:x",
        kernel="softmax_rows",
        candidate_name="softmax_rows.py",
        model="openai:m",
        trial=1,
        seed=1,
        temperature=0.7,
    )
    (message,) = build_messages(request, SPEC)
    text = message["content"]
    assert "`softmax_rows` (category reduction)" in text and "Numerically stable" in text
    assert "{" not in text.split("```python", 1)[0]  # every slot filled
