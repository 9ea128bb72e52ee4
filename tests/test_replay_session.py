"""`nearmiss replay`: a recorded model session replays deterministically, re-runs on today's JAX
with its recorded answers at zero tokens, and its timeline is rendered. Real Temporal, real
PostgreSQL, the openai client against the fake server for the recording. The sessions repair
the tiny kernel of ``tests/tiny/double_rows``: a replay is about a session's steps, not its
kernel."""

from __future__ import annotations

import json
import os

from fake_openai import FakeOpenAI, answer
from sessions import full_file, run_session

from conftest import OPS, ROOT, run_cli
from nearmiss.client.replay import check_determinism, compare, rerun
from nearmiss.client.service import build_worker, start_session
from workflows.loop import Guards
from workflows.models import FixRequest, FixResult, RepairResult

TINY = ROOT / "tests" / "tiny" / "double_rows"
GOLDEN = (TINY / "golden.py").read_text()
# Round 1 keys the grid on the compact case's 12 rows: it passes validation and fails
# certification (the extended case's 24 rows), so round 2 is asked for another answer.
KEYED_GRID = GOLDEN.replace("grid=(pl.cdiv(rows, BLOCK_R),)", "grid=(2,)")
assert KEYED_GRID != GOLDEN


async def record_two_round_session(client, store):
    with FakeOpenAI() as fake:
        fake.script(
            answer(full_file(KEYED_GRID), prompt_tokens=1000, completion_tokens=200),
            answer(full_file(GOLDEN), prompt_tokens=1100, completion_tokens=150),
        )
        result, *_ = await run_session(
            client, store, fake, TINY / "spec.py", TINY / "variants" / "floor_grid.py"
        )
    assert result.certified and result.rounds == 2 and result.tokens.total == 2450
    return result.session_id


async def test_a_recorded_session_replays_and_reruns_without_tokens(
    client, seeded_store, temporal_address, postgres_dsn
):
    """The re-run is the one `nearmiss replay` starts (``rerun``, served by the command's own
    worker), checked here as well as in the command's output."""
    store = seeded_store
    session = await record_two_round_session(client, store)
    determinism = await check_determinism(client, session)
    assert determinism.ok and determinism.history_events > 10, determinism.detail

    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    ran = run_cli("replay", session, "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["determinism"]["ok"] and out["rerun"]["same_behaviour"]
    assert out["rerun"]["tokens"] == {"input": 0, "cached_input": 0, "output": 0}
    events = [row["event"] for row in out["timeline"]]
    assert events[0] == "RepairStarted" and events[-1] == "RepairFinished"
    assert events.count("FixProposed") == 2 and "KnowledgeRetrieved" in events

    rerun_id = out["rerun"]["session_id"]
    again = await client.get_workflow_handle(rerun_id, result_type=RepairResult).result()
    comparison = await compare(store, session, rerun_id)
    assert again.certified and again.rounds == 2 and again.tokens.total == 0
    assert comparison.same_behaviour, comparison.changes
    phases = [old.phase for old, _ in comparison.steps]
    assert phases[0] == "forensics" and phases[-1] == "certify" and "validate" in phases
    assert all(old.candidate_hash == new.candidate_hash for old, new in comparison.steps)
    # The re-run reused the recorded answers: its fixes name the recording, and it taught the
    # knowledge base nothing (no session learns twice from one recording).
    fixes = [e.payload for e in await store.read_stream(rerun_id) if e.type == "FixProposed"]
    assert [f["model"] for f in fixes] == [f"replay:{session}"] * 2
    learned = await store.recent_of_type("KnowledgeAdded") + await store.recent_of_type(
        "KnowledgeConfirmed"
    )
    assert rerun_id not in {e.payload.get("session_id") for e in learned}

    text = run_cli("replay", session, "--no-rerun", env=env)
    assert text.returncode == 0 and "determinism check: ok" in text.stdout
    missing = run_cli("replay", "repair-nope", env=env)
    assert missing.returncode == 2 and "no repair session repair-nope" in missing.stderr


async def test_a_change_in_behaviour_is_named(client, seeded_store):
    # Control: comparing two sessions that behave differently must report the differences. The
    # certified one is a kernel right from the start (its checks, no fix); the other is stuck.
    store = seeded_store
    async with build_worker(client, store, fail_workflows_on_error=True):
        certified = await start_session(
            client, store, TINY / "spec.py", TINY / "golden.py", "playbook", Guards()
        )
        stuck = await start_session(
            client,
            store,
            OPS / "gelu_tanh" / "spec.py",
            OPS / "gelu_tanh" / "variants" / "wrong_constant.py",
            "playbook",
            Guards(),
        )
        await certified.result(), await stuck.result()
    comparison = await compare(store, certified.id, stuck.id)
    assert not comparison.same_behaviour
    assert any(c.startswith("outcome: recorded certified") for c in comparison.changes)
    assert any("a different candidate was checked" in c for c in comparison.changes)


class SpentSearch:
    """The search's answers as a round budget too small for the fix gives them: two rounds
    that spend it (five edits each, nothing found, more left), then the fix, found past the
    ten screened before. Records where each round was asked to start (``request.skip``)."""

    name = "search"

    def __init__(self) -> None:
        self.skips: list[int] = []

    async def propose(self, request: FixRequest) -> FixResult:
        self.skips.append(request.skip)
        if request.skip < 10:
            spent = f"search: screened 5 edits after {request.skip} (more were left)"
            return FixResult(model="search", reason=spent, resume_at=request.skip + 5)
        return FixResult(model="search", source=GOLDEN, summary="mutant:found", reason="found")


async def test_a_search_goes_on_across_rounds_through_the_workflow_and_replays(client, store):
    """Zero-token fixers stop a session at the first round without an edit, except a search
    that ran out of budget, not of edits: the workflow asks it again from where it stopped (the
    activity's request carries ``skip``), the event log keeps where (``resume_at``), and a
    replay of the session goes the same way."""
    search = SpentSearch()
    async with build_worker(client, store, lambda model: search, fail_workflows_on_error=True):
        handle = await start_session(
            client,
            store,
            TINY / "spec.py",
            TINY / "variants" / "floor_grid.py",
            "search",
            Guards(),
        )
        result = await handle.result()
        fixes = [e.payload for e in await store.read_stream(handle.id) if e.type == "FixProposed"]
        assert search.skips == [0, 5, 10]
        assert result.certified and result.rounds == 3 and result.tokens.total == 0
        assert [f.get("resume_at") for f in fixes] == [5, 10, None]
        determinism = await check_determinism(client, handle.id)
        again = await (await rerun(client, store, handle.id)).result()
    assert determinism.ok, determinism.detail
    assert again.certified and again.rounds == 3  # the recorded spent rounds go on too


class StepAsideSearch:
    """A search whose first round finds only an edit that gets further (here: one that keeps
    the score, a comment added), with edits of the kernel left; asked again of the unedited
    kernel from where it stopped, it finds the fix. Records what each round was asked to edit
    and from where (``request.source``, ``request.skip``)."""

    name = "search"

    def __init__(self, original: str) -> None:
        self.original = original
        self.asked: list[tuple[str, int]] = []

    async def propose(self, request: FixRequest) -> FixResult:
        base = "unedited" if request.source == self.original else "edited"
        self.asked.append((base, request.skip))
        if base == "edited":
            return FixResult(model="search", reason="search: none was left")
        if request.skip < 7:
            aside = self.original + "# a step aside\n"
            return FixResult(
                model="search",
                source=aside,
                summary="mutant:aside",
                reason="got further",
                resume_at=7,
            )
        return FixResult(model="search", source=GOLDEN, summary="mutant:fix", reason="found")


async def test_a_search_session_comes_back_to_the_unedited_kernel_and_replays(client, store):
    """After a search's edit that only got further, the next round edits the unedited kernel
    again, from where its search stopped, with the kernel's own evidence: the fix is found
    there, as one edit of the original. The event log names the kernel each round edited, and
    the session replays deterministically."""
    original = (TINY / "variants" / "floor_grid.py").read_text()
    search = StepAsideSearch(original)
    async with build_worker(client, store, lambda model: search, fail_workflows_on_error=True):
        handle = await start_session(
            client,
            store,
            TINY / "spec.py",
            TINY / "variants" / "floor_grid.py",
            "search",
            Guards(),
        )
        result = await handle.result()
        events = await store.read_stream(handle.id)
        determinism = await check_determinism(client, handle.id)
    fixes = [e.payload for e in events if e.type == "FixProposed"]
    judged = [e.payload for e in events if e.type == "CandidateValidated"]
    assert search.asked == [("unedited", 0), ("unedited", 7)]
    assert result.certified and result.rounds == 2
    assert [f["base_hash"] for f in fixes] == [result.original_hash] * 2
    assert [f.get("resume_at") for f in fixes] == [7, None]
    assert judged[0]["outcome"] == "same" and judged[0]["best_hash"] != result.original_hash
    assert determinism.ok, determinism.detail
