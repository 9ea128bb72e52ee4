"""The tool-using fix agent: scripted tool-call conversations through the real openai client,
real Temporal, real PostgreSQL, and real sandboxed experiments — on corpus kernels where the
experiment's answer is the point (a carry, an accumulator), else on the tiny kernel of
``tests/tiny/double_rows``: its floor-divided grid fails the session's first check, so the
session goes straight to the round whose tools the test is about."""

from __future__ import annotations

import asyncio
import json
import os
import signal

from fake_openai import FakeOpenAI, answer, call, tool_answer, tools_unsupported
from sessions import MODEL, run_session
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from test_worker_crash import start_worker, stop_workers

from conftest import OPS, ROOT
from nearmiss.client.service import start_session
from nearmiss.reports import load_session
from workflows.loop import Guards
from workflows.repair import RepairWorkflow

CUMSUM = OPS / "cumsum_rows"
# The shipped spec cut to two cases, the ragged one compact: the carry bug fails the first check.
CUMSUM_SPEC = ROOT / "tests" / "tiny" / "cumsum_rows" / "spec.py"
TINY = ROOT / "tests" / "tiny" / "double_rows"
CARRY_PROBE = (ROOT / "tests" / "probes" / "cumsum_carry.py").read_text()
# The carry each (row block, column block) step should start from: the row totals so far.
CARRY_REFERENCE = "jnp.pad(jnp.cumsum(x, axis=1)[:, 127:-1:128], ((0, 0), (1, 0)))"
RESET_EVERY_ROW_BLOCK = (
    "<<<<<<< SEARCH\n    @pl.when((pl.program_id(0) == 0) & (j == 0))\n=======\n"
    "    @pl.when(j == 0)\n>>>>>>> REPLACE\n"
)
CEIL_GRID = (
    "<<<<<<< SEARCH\n        grid=(rows // BLOCK_R,),\n=======\n"
    "        grid=(pl.cdiv(rows, BLOCK_R),),\n>>>>>>> REPLACE\n"
)


def tool_events(events) -> list[dict]:
    return [e.payload for e in events if e.type == "ToolCalled"]


def tool_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_experiments_locate_a_carry_reset_on_the_wrong_axis_and_the_fix_certifies(
    client, seeded_store
):
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(call("error_map", {"case": "ragged"}), prompt_tokens=3000),
            tool_answer(
                call(
                    "probe",
                    {
                        "probe_source": CARRY_PROBE,
                        "case": "ragged",
                        "reference": {"carry_in": CARRY_REFERENCE},
                    },
                ),
                prompt_tokens=3500,
            ),
            tool_answer(
                call(
                    "propose_edit",
                    {
                        "summary": "reset the carry at every row block",
                        "edit": RESET_EVERY_ROW_BLOCK,
                    },
                ),
                prompt_tokens=4000,
            ),
        )
        result, events, progress, _ = await run_session(
            client,
            seeded_store,
            fake,
            CUMSUM_SPEC,
            CUMSUM / "variants" / "reset_once.py",
        )
        requests = fake.requests
    assert result.certified and result.rounds == 1, result
    assert result.tokens.input == 10_500 and progress.tool_calls == 2
    calls = tool_events(events)
    assert [c["tool"] for c in calls] == ["error_map", "probe"]
    assert all(c["ran"] and c["ok"] and c["round"] == 1 for c in calls)
    # The experiments' answers reached the model: the error map shows the bad row blocks, the
    # probe the first stale carry (row block 1 starts from row block 0's totals).
    error_map, probe = tool_messages(requests[2])
    assert "#" in error_map
    assert "first at [8, 0]" in probe
    assert calls[1]["summary"].startswith(probe[:100])
    fix = next(e.payload for e in events if e.type == "FixProposed")
    assert fix["summary"] == "reset the carry at every row block" and fix["tool_calls"] == 2
    # Tools were offered natively, and the full results are kept by hash.
    assert {t["function"]["name"] for t in requests[0]["tools"]} >= {"probe", "propose_edit"}
    data = json.loads(await seeded_store.get_blob(calls[1]["data_hash"]))
    assert data["comparisons"][0]["first_index"] == [8, 0]
    # The report's timeline shows the experiments.
    view = await load_session(seeded_store, result.session_id)
    shown = [row.text for row in view.timeline if row.kind == "ToolCalled"]
    assert shown[0].startswith("experiment error_map(") and "6/9 bad" in shown[0]
    assert shown[1].startswith("experiment probe(") and "carry_in float32[20, 3]" in shown[1]
    # A session with tool calls replays deterministically.
    history = await client.get_workflow_handle(result.session_id).fetch_history()
    replayer = Replayer(workflows=[RepairWorkflow], data_converter=pydantic_data_converter)
    assert (await replayer.replay_workflow(history)).replay_failure is None


async def test_a_probe_finds_an_uninitialised_accumulator(client, seeded_store):
    init = (
        "<<<<<<< SEARCH\ndef _matmul_body(a_ref, b_ref, o_ref):\n=======\n"
        "def _matmul_body(a_ref, b_ref, o_ref):\n    @pl.when(pl.program_id(2) == 0)\n"
        "    def _init():\n        o_ref[...] = jnp.zeros_like(o_ref)\n\n>>>>>>> REPLACE\n"
    )
    probe = {
        "probe_source": (ROOT / "tests" / "probes" / "matmul_acc.py").read_text(),
        "reference": {"accumulator_at_first_step": "jnp.zeros((a.shape[0], b.shape[1]))"},
    }
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(call("probe", probe)),
            tool_answer(call("propose_edit", {"summary": "zero the accumulator", "edit": init})),
        )
        result, events, *_ = await run_session(
            client,
            seeded_store,
            fake,
            OPS / "matmul" / "spec.py",
            OPS / "matmul" / "variants" / "missing_init.py",
        )
        seen = tool_messages(fake.requests[1])[0]
    # What the model saw: the accumulator is garbage (NaN) before the first step adds to it.
    assert "accumulator_at_first_step float32[128, 128]" in seen and "NaN 16384" in seen
    assert "16384/16384 differ" in seen
    assert [c["tool"] for c in tool_events(events)] == ["probe"]
    assert result.certified and result.rounds == 1


async def test_a_probe_that_breaks_the_integrity_rules_is_refused(client, seeded_store):
    cheat = "import os\n\ndef probe(x):\n    return {'cwd': os.getcwd()}\n"
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(call("probe", {"probe_source": cheat})),
            answer(f"Round the grid up.\n{CEIL_GRID}"),
        )
        result, events, *_ = await run_session(
            client, seeded_store, fake, TINY / "spec.py", TINY / "variants" / "floor_grid.py"
        )
        refused = tool_messages(fake.requests[1])[0]
    assert "forbidden_import" in refused
    (called,) = tool_events(events)
    assert called["tool"] == "probe" and called["ok"] is False
    assert result.certified


async def test_a_malformed_tool_call_is_answered_with_an_error_not_a_crash(client, seeded_store):
    with FakeOpenAI() as fake:
        fake.script(
            tool_answer(call("run_case", "{not json"), call("frobnicate", {"x": 1})),
            tool_answer(call("kb_search", {"query": "rows past the last full block are wrong"})),
            answer(f"Round the grid up.\n{CEIL_GRID}"),
        )
        result, events, *_ = await run_session(
            client, seeded_store, fake, TINY / "spec.py", TINY / "variants" / "floor_grid.py"
        )
        second, third = fake.requests[1], fake.requests[2]
    assert result.certified and result.rounds == 1
    bad_json, unknown = tool_messages(second)
    assert "not valid JSON" in bad_json and "unknown tool 'frobnicate'" in unknown
    calls = tool_events(events)
    assert [(c["tool"], c["ran"], c["ok"]) for c in calls] == [
        ("run_case", False, False),
        ("frobnicate", False, False),
        ("kb_search", True, True),
    ]
    # The knowledge base answers with entries, the same ids the full result keeps.
    found = json.loads(await seeded_store.get_blob(calls[2]["data_hash"]))["entry_ids"]
    assert found and all(f"[{entry_id}]" in tool_messages(third)[-1] for entry_id in found)


async def test_the_per_round_tool_limit_stops_a_looping_model(client, seeded_store):
    looping = [tool_answer(call("run_case", {"case": "ragged"})) for _ in range(3)]
    with FakeOpenAI() as fake:
        fake.script(*looping)
        result, events, *_ = await run_session(
            client,
            seeded_store,
            fake,
            TINY / "spec.py",
            TINY / "variants" / "floor_grid.py",
            guards=Guards(max_rounds=1, max_tool_calls_per_round=2),
        )
        requests = fake.requests
    assert len(requests) == 3  # two experiments, then the turn that must edit
    assert requests[2]["tool_choice"] == "none"
    assert "budget of this round is spent" in requests[2]["messages"][-1]["content"]
    assert [(c["ran"], c["summary"][:8]) for c in tool_events(events)] == [
        (True, tool_events(events)[0]["summary"][:8]),
        (True, tool_events(events)[1]["summary"][:8]),
        (False, "not run:"),
    ]
    fix = next(e.payload for e in events if e.type == "FixProposed")
    assert fix["candidate_hash"] is None and "kept calling tools" in fix["reason"]
    assert not result.certified and result.stop_reason == "max_rounds"


async def test_an_endpoint_without_tool_calling_gets_the_text_protocol(client, seeded_store):
    with FakeOpenAI() as fake:
        fake.script(
            tools_unsupported(),
            answer('Let me look first.\nTOOL run_case {"case": "ragged"}'),
            answer(f"Round the grid up.\n{CEIL_GRID}"),
        )
        result, events, *_ = await run_session(
            client, seeded_store, fake, TINY / "spec.py", TINY / "variants" / "floor_grid.py"
        )
        requests = fake.requests
    assert result.certified
    assert "tools" in requests[0] and "tools" not in requests[1]
    assert "TOOL <name>" in requests[1]["messages"][0]["content"]
    results = requests[2]["messages"][-1]["content"]
    assert results.startswith("Results:") and "boundary" in results
    assert [c["tool"] for c in tool_events(events)] == ["run_case"]


async def test_tool_calls_survive_a_worker_restart_mid_round(
    client, seeded_store, temporal_address, postgres_dsn, tmp_path
):
    store = seeded_store
    with FakeOpenAI() as fake, open(tmp_path / "workers.log", "wb") as log:
        fake.script(
            tool_answer(call("run_case", {"case": "ragged"})),
            tool_answer(call("error_map", {"case": "ragged"})),
            tool_answer(call("propose_edit", {"summary": "ceil grid", "edit": CEIL_GRID})),
        )
        env = dict(
            os.environ,
            TEMPORAL_ADDRESS=temporal_address,
            NEARMISS_DATABASE_URL=postgres_dsn,
            NEARMISS_OPENAI_BASE_URL=fake.base_url,
            NEARMISS_OPENAI_API_KEY="test-key",
        )
        first, second = start_worker(env, log), None
        try:
            handle = await start_session(
                client,
                store,
                TINY / "spec.py",
                TINY / "variants" / "floor_grid.py",
                MODEL,
                Guards(),
            )
            # Kill the worker while the round's second experiment runs: the first is recorded.
            await wait_until_running(handle, store, "run_tool", tool_calls_recorded=1)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            second = start_worker(env, log)
            result = await asyncio.wait_for(handle.result(), timeout=240)
        finally:
            stop_workers(first, second)
        served = len(fake.requests)
    events = await store.read_stream(handle.id)
    assert result.certified, (tmp_path / "workers.log").read_text()[-3000:]
    assert served == 3  # no model turn was asked twice
    calls = tool_events(events)
    assert [c["tool"] for c in calls] == ["run_case", "error_map"]  # none lost, none twice
    assert len({c["call_id"] for c in calls}) == 2
    assert [e.version for e in events] == list(range(1, len(events) + 1))


async def wait_until_running(handle, store, activity: str, tool_calls_recorded: int) -> None:
    for _ in range(1200):
        recorded = tool_events(await store.read_stream(handle.id))
        if len(recorded) >= tool_calls_recorded:
            description = await handle.describe()
            pending = description.raw_description.pending_activities
            if any(p.activity_type.name == activity for p in pending):
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{activity} never ran after {tool_calls_recorded} recorded tool calls")
