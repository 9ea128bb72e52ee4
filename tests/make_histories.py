"""Regenerate the saved workflow histories that tests/test_replay.py replays.

    .venv/bin/python tests/make_histories.py [NAME ...]

Runs short sessions on a private dev stack and writes their histories as JSON to
tests/histories/: three repairs with a scripted fixer (the replay only needs the activities'
recorded results), a repair whose fix is a tool-using round of a chat model (the fake model
endpoint runs one experiment, then edits), a fleet of three playbook repairs over two runs
(continue-as-new: both runs' histories are kept), a regenerate session of two trials
answered by the fake model endpoint, and a search session that comes back to the unedited
kernel (``search_beam``: a scripted search under the model name ``search``).
NAME picks some of them (default: all). Re-run it after an intended change to a workflow's
command sequence, and keep old histories that must still replay (a change that breaks them needs
workflow.patched): the *_before_kb.json ones predate knowledge retrieval and learning and replay
through their patches; the *before_local* ones predate local activities for recording,
retrieval and learning (the ``local-activities`` patch; ``fleet.before_local.run1.json``: a
fleet's history keeps its workflow id ``fleet`` before the first dot); the *before_start* ones
predate deciding every patch at the start of the run (workflows/patches.py); agent_round.json was
recorded before the loop decided retrieval, the kind of round and learning (the workflow carried
those decisions out itself then).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from fake_openai import FakeOpenAI, answer, call, tool_answer
from sessions import full_file

from conftest import OPS, ROOT, private_stack
from infra.devstack import DevStack, PostgresService
from kb.events import EventStore
from kb.knowledge import load_seed
from nearmiss.client.fleet import MemberFile, start_fleet
from nearmiss.client.service import build_worker, connect, start_session
from nearmiss.client.settings import Settings
from workflows.loop import Guards
from workflows.models import FixResult
from workflows.regenerate import RegenerateRequest, RegenerateWorkflow
from workflows.repair import TASK_QUEUE

OUT = ROOT / "tests" / "histories"


class ScriptedFixer:
    name = "scripted"

    def __init__(self, sources: list[str | None]) -> None:
        self.sources = list(sources)

    async def propose(self, request) -> FixResult:
        source = self.sources.pop(0) if self.sources else None
        return FixResult(source=source, summary="scripted", model="scripted", reason="scripted")


SESSIONS = {
    "certified_after_two_rounds": (
        "matmul/variants/missing_init.py",
        ["matmul/variants/no_accumulate.py", "matmul/golden.py"],
        Guards(),
    ),
    # Without knowledge: the first session's learned patch would otherwise fix it at once.
    "cycle": (
        "matmul/variants/missing_init.py",
        ["matmul/variants/missing_init.py"],
        Guards(),
    ),
    "max_rounds": ("softmax_rows/variants/floor_grid.py", [None], Guards(max_rounds=1)),
}


async def repair(client, store, name: str) -> None:
    candidate, script, guards = SESSIONS[name]
    fixer = ScriptedFixer([(OPS / s).read_text() if s else None for s in script])
    async with build_worker(client, store, lambda _, f=fixer: f):
        handle = await start_session(
            client,
            store,
            OPS / candidate.split("/")[0] / "spec.py",
            OPS / candidate,
            "scripted",
            guards,
            use_kb=name != "cycle",
        )
        result = await handle.result()
        print(name, result.stop_reason)
        await save(name, handle)


async def agent_round(client, store) -> None:
    """A chat model's round, after retrieval: one experiment (run_case), then the edit that
    certifies; then the knowledge base learns from the session."""
    softmax = OPS / "softmax_rows"
    ceil_grid = (
        "Round the grid up.\n<<<<<<< SEARCH\n        grid=(rows // BLOCK_R,),\n=======\n"
        "        grid=(pl.cdiv(rows, BLOCK_R),),\n>>>>>>> REPLACE\n"
    )
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(call("run_case", {"case": "ragged"}), prompt_tokens=1200),
            answer(ceil_grid, prompt_tokens=1500),
        )
        os.environ["NEARMISS_OPENAI_BASE_URL"] = fake.base_url
        os.environ["NEARMISS_OPENAI_API_KEY"] = "test-key"
        async with build_worker(client, store):
            handle = await start_session(
                client,
                store,
                softmax / "spec.py",
                softmax / "variants" / "floor_grid.py",
                "openai:fake-model",
                Guards(),
            )
            result = await handle.result()
            print("agent_round", result.stop_reason, result.tokens.total)
            await save("agent_round", handle)


class StepAsideSearch:
    """A search whose first round finds only an edit that keeps the score (a comment added),
    with edits left; asked again of the unedited kernel from there, it finds the fix."""

    def __init__(self, original: str, fix: str) -> None:
        self.original, self.fix = original, fix

    async def propose(self, request) -> FixResult:
        if request.source != self.original:
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
        return FixResult(model="search", source=self.fix, summary="mutant:fix", reason="found")


async def search_beam(client, store) -> None:
    """A search session that comes back to the unedited kernel after an edit that only got
    further (workflows.loop's beam, the ``unedited-in-beam`` patch), and certifies from it."""
    softmax = OPS / "softmax_rows"
    original = softmax / "variants" / "floor_grid.py"
    fixer = StepAsideSearch(original.read_text(), (softmax / "golden.py").read_text())
    async with build_worker(client, store, lambda _, f=fixer: f):
        handle = await start_session(
            client, store, softmax / "spec.py", original, "search", Guards(), use_kb=False
        )
        result = await handle.result()
        print("search_beam", result.stop_reason, result.rounds)
        await save("search_beam", handle)


def _member(name: str) -> MemberFile:
    kernel, variant = name.split("/")
    return MemberFile(name, OPS / kernel / "spec.py", OPS / kernel / "variants" / f"{variant}.py")


async def fleet(client, store) -> None:
    """Three playbook members, two at a time, two per run: the third starts in a second run."""
    members = ["matmul/missing_init", "gelu_tanh/wrong_constant", "layer_norm/f32_output"]
    async with build_worker(client, store):
        handle = await start_fleet(
            client,
            store,
            [_member(m) for m in members],
            model="playbook",
            guards=Guards(),
            concurrency=2,
            members_per_run=2,
            fleet_id="fleet",  # its children's ids derive from it: the replay needs the same
        )
        result = await handle.result()
        print("fleet", {r.name: r.verdict for r in result.results})
        first = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        await save("fleet.run1", first)
        await save("fleet.run2", client.get_workflow_handle(handle.id))


async def regenerate(client, store) -> None:
    """Two concurrent trials: the golden kernel and an answer without code."""
    softmax = OPS / "softmax_rows"
    with FakeOpenAI() as fake:
        fake.script(
            answer(full_file((softmax / "golden.py").read_text()), prompt_tokens=900),
            answer("I would tile the rows, but I am not sure how.", prompt_tokens=900),
        )
        os.environ["NEARMISS_OPENAI_BASE_URL"] = fake.base_url
        os.environ["NEARMISS_OPENAI_API_KEY"] = "test-key"
        request = RegenerateRequest(
            spec_hash=await store.put_blob((softmax / "spec.py").read_bytes()),
            kernel="softmax_rows",
            candidate_name="softmax_rows.py",
            model="openai:fake-model",
            trials=2,
            seed=40,
        )
        async with build_worker(client, store):
            handle = await client.start_workflow(
                RegenerateWorkflow.run, request, id="regenerate-history", task_queue=TASK_QUEUE
            )
            result = await handle.result()
            print("regenerate", result.pass_at_1, result.pass_at_k)
            await save("regenerate_two_trials", handle)


async def save(name: str, handle) -> None:
    """Saved as NAME.json; a replay takes the part of NAME before any dot as the workflow id."""
    history = await handle.fetch_history()
    (OUT / f"{name}.json").write_text(history.to_json())


MAKERS = {name: lambda c, s, n=name: repair(c, s, n) for name in SESSIONS} | {
    "agent_round": agent_round,
    "search_beam": search_beam,
    "fleet": fleet,
    "regenerate": regenerate,
}


async def main(names: list[str]) -> None:
    unknown = set(names) - set(MAKERS)
    if unknown:
        sys.exit(f"unknown history {sorted(unknown)}: choose from {', '.join(MAKERS)}")
    with tempfile.TemporaryDirectory() as home:
        config = private_stack(Path(home))
        settings = Settings(config.temporal_address, config.connect_dsn, True, config)
        with DevStack(config):
            store = await EventStore.connect(config.connect_dsn)
            await load_seed(store)
            client = await connect(settings)
            for name in names or MAKERS:
                await MAKERS[name](client, store)
            await store.close()
        PostgresService(config).remove_data()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
