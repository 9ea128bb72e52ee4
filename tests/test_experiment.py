"""`nearmiss experiment`: the table's arithmetic (pure), the ablation switches of the loop, and
one small experiment end to end — real Temporal, real PostgreSQL, the real openai client talking
to a fake endpoint that answers by what it is asked, real checks — cross-checked against the log.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import xml.etree.ElementTree as ET
from contextlib import redirect_stdout

import pytest
from event_payloads import payload
from fake_openai import Answer, FakeOpenAI
from sessions import full_file

from conftest import OPS
from nearmiss.cli import experiment as experiment_cli
from nearmiss.client.service import build_worker
from nearmiss.engine.errors import UsageError
from nearmiss.engine.models import Evidence
from nearmiss.events import (
    ExperimentFinished,
    ExperimentStarted,
    RegenerateFinished,
    RepairFinished,
)
from nearmiss.experiments.config import ARMS, ExperimentConfig, corpus, default_sample, select
from nearmiss.experiments.outputs import csv_text, markdown, pass_rates_svg, tokens_svg
from nearmiss.experiments.records import load_table
from nearmiss.experiments.runner import run_experiment
from nearmiss.experiments.table import compute_table
from workflows.loop import Guards, LoopState, RepairLoop

SOFTMAX = OPS / "softmax_rows"
GOLDEN = (SOFTMAX / "golden.py").read_text()
FLOOR_GRID = (SOFTMAX / "variants" / "floor_grid.py").read_text()
# Right numbers the wrong way: XLA computes the softmax, the pallas_call only copies it.
CHEAT = (OPS / "integrity" / "cheats" / "copy_kernel_softmax.py").read_text()

# --- the table, from payloads alone ----------------------------------------------------------


def tokens(i, c=0, o=0):
    return {"input": i, "cached_input": c, "output": o}


def repaired(certified: bool, used: dict) -> RepairFinished:
    return RepairFinished(**payload("RepairFinished", certified=certified, tokens=used))


def regenerated(trials: list[dict]) -> RegenerateFinished:
    return RegenerateFinished(**payload("RegenerateFinished", trials=trials))


def test_the_table_follows_the_papers_definitions():
    config = {"arms": ["debug", "regenerate", "debug-no-integrity"], "trials": 2}
    config |= {"near_misses": ["a/x", "b/y"], "model": "openai:m"}
    started = ExperimentStarted(experiment_id="e1", config=config, near_misses=[], arms={})
    audit = {"session_id": "n-a1", "rejected": True, "report_hash": "sha256:r"}
    arms = {
        "debug": {"a/x": {"sessions": ["d-a1", "d-a2"]}, "b/y": {"sessions": ["d-b1", "d-b2"]}},
        "regenerate": {"a/x": {"sessions": ["r-a"]}, "b/y": {"sessions": ["r-b"]}},
        "debug-no-integrity": {
            "a/x": {"sessions": ["n-a1", "n-a2"], "audits": [audit]},
            "b/y": {"sessions": ["n-b1", "n-b2"], "audits": []},
        },
    }
    finishes = {
        "d-a1": repaired(True, tokens(1000, 400, 200)),
        "d-a2": repaired(False, tokens(3000, 0, 600)),
        "d-b1": repaired(True, tokens(500, 0, 100)),
        "d-b2": None,  # never finished: a failed trial
        "r-a": regenerated(
            [{"trial": t, "certified": False, "tokens": tokens(900)} for t in (1, 2)]
        ),
        "r-b": regenerated(
            [
                {"trial": 1, "certified": True, "tokens": tokens(800, 0, 200)},
                {"trial": 2, "certified": False, "tokens": tokens(800, 0, 200)},
            ]
        ),
        "n-a1": repaired(True, tokens(100)),
        "n-a2": repaired(False, tokens(100)),
        "n-b1": repaired(False, tokens(100)),
        "n-b2": repaired(False, tokens(100)),
    }
    finished = ExperimentFinished(experiment_id="e1", wall_s=1.0, arms=arms)
    table = compute_table(started, finished, finishes)
    debug, regenerate, no_integrity = table.rows
    # a/x: 1 of 2, b/y: 1 of 2 (the unfinished trial fails) -> Pass@1 0.5; both recovered.
    assert (debug.pass_at_1, debug.pass_at_k, debug.successes, debug.attempts) == (0.5, 1, 2, 4)
    assert debug.unfinished == 1 and debug.tokens == tokens(4500, 400, 900)
    # Tokens of one trial, averaged: a/x (1200 + 3600) / 2, b/y 600 / 2.
    assert debug.tokens_per_operator == pytest.approx((2400 + 300) / 2)
    assert debug.uncached_per_operator == pytest.approx(((4800 - 400) / 2 + 300) / 2)
    assert debug.tokens_per_success == pytest.approx(5400 / 2)
    assert (regenerate.pass_at_1, regenerate.pass_at_k) == (0.25, 0.5)
    assert regenerate.tokens_per_success == pytest.approx(3800)
    assert no_integrity.tokens_per_success == 400 and no_integrity.pass_at_k == 0.5
    assert table.only_debug == ["a/x"]  # b/y: regenerate recovered it too
    (audited,) = table.audits
    assert (audited.arm, audited.audited, audited.rejected) == ("debug-no-integrity", 1, 1)
    assert audited.rejected_sessions == ["n-a1"]
    # An arm without a success has no tokens per success, shown as such everywhere.
    finishes["n-a1"] = repaired(False, tokens(100))
    row = compute_table(started, finished, finishes).rows[2]
    assert row.tokens_per_success is None

    text = markdown(table)
    assert "| debug | all | 50.0 % (2/4) | 100.0 % (2/2) | 1,350 | 2,700 | 1,250 |" in text
    assert "Operators only debug recovered" in text and "1 (a/x)" in text
    assert 'integrity-rejected "successes"' in text and "1 of 1" in text
    assert "| a/x | 1/2 | 0/2 | 1/2 |" in text
    rows = list(csv.DictReader(io.StringIO(csv_text(table))))
    assert [r["arm"] for r in rows] == ["debug", "regenerate", "debug-no-integrity"]
    assert rows[0]["pass_at_1"] == "0.5000" and rows[0]["unfinished"] == "1"
    for svg in (pass_rates_svg(table), tokens_svg(table)):
        root = ET.fromstring(svg)  # well-formed, with a bar per value
        assert root.tag.endswith("svg") and len(root.findall("{*}rect")) >= 3


# --- configuration and the loop's ablation switch --------------------------------------------


def test_near_misses_are_chosen_by_operator_or_id_and_the_default_covers_each_category():
    assert [nm.id for nm in select(["softmax_rows"])] == [
        "softmax_rows/floor_grid",
        "softmax_rows/no_max_subtraction",
    ]
    assert [nm.id for nm in select(["matmul/missing_init"])] == ["matmul/missing_init"]
    sample = default_sample(corpus())
    assert len({nm.category for nm in sample}) == len(sample) == 8
    with pytest.raises(UsageError, match="no near-miss 'softmax_rows/nope'"):
        select(["softmax_rows/nope"])


def test_bad_arms_and_a_playbook_regenerate_are_usage_errors():
    with pytest.raises(UsageError, match="regenerate arm needs --model openai:MODEL"):
        ExperimentConfig(model="playbook").validate_usage()
    with pytest.raises(UsageError, match="unknown arm"):
        ExperimentConfig(model="playbook", arms=["debug", "debug-no-tests"]).validate_usage()
    ExperimentConfig(model="playbook", arms=["debug", "debug-compact-only"]).validate_usage()


async def test_the_cli_refuses_bad_input_before_starting_anything(monkeypatch):
    # Services that do not exist: reaching them would fail differently (and slowly).
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")
    monkeypatch.setenv("NEARMISS_DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    with pytest.raises(UsageError, match="regenerate arm"):
        await experiment_cli.run(parse(["experiment", "--ops", "softmax_rows"]))
    with pytest.raises(UsageError, match="no near-miss"):
        await experiment_cli.run(parse(["experiment", "--ops", "nope", "--arms", "debug"]))


def test_the_compact_only_ablation_certifies_on_the_compact_suite():
    def passed(suite):
        return Evidence(candidate_hash="h", suite=suite, certified=True, compact_passed=True)

    for certify_suite in ("all", "compact"):
        loop = RepairLoop(LoopState(guards=Guards(), certify_suite=certify_suite))
        forensics = loop.begin("h", 0.0).action
        step = loop.on_evidence(forensics, passed("compact"), 0.0)
        assert (step.action.kind, step.action.suite) == ("certify", certify_suite)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nearmiss")
    experiment_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


# --- one experiment, end to end --------------------------------------------------------------


class AnsweringFake(FakeOpenAI):
    """Answers by what is asked: sessions run concurrently, so a fixed script order would not
    say which session gets which answer."""

    def _next(self, body, path, headers):
        with self._lock:
            self.requests.append(body)
        prompt = "\n".join(m.get("content") or "" for m in body["messages"] if m["role"] == "user")
        if "Write, from scratch" in prompt:  # regenerate: trial 1 a broken kernel, 2 no code
            if body["seed"] % 2:
                return Answer(full_file(FLOOR_GRID), prompt_tokens=700, completion_tokens=300)
            return Answer("I cannot write this one.", prompt_tokens=700, completion_tokens=300)
        if "(nothing yet)" in prompt:  # a session's first fix: the cheat
            return Answer(
                full_file(CHEAT), prompt_tokens=1000, completion_tokens=100, cached_tokens=400
            )
        return Answer(full_file(GOLDEN), prompt_tokens=1100, completion_tokens=120)


def session_tokens(events, kind="FixProposed") -> dict:
    total = {"input": 0, "cached_input": 0, "output": 0}
    for e in events:
        if e.type == kind:
            for key in total:
                total[key] += e.payload["tokens"][key]
    return total


async def test_a_small_experiment_end_to_end(
    client, seeded_store, postgres_dsn, temporal_address, tmp_path, monkeypatch
):
    store = seeded_store
    lines: list[str] = []
    with AnsweringFake() as fake:
        monkeypatch.setenv("NEARMISS_OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("NEARMISS_OPENAI_API_KEY", "test-key")
        # One trial an arm: more add sessions, not behaviour (test_regenerate runs several
        # trials of one session; the table's per-trial sums are checked below either way).
        config = ExperimentConfig(
            near_misses=["softmax_rows/floor_grid"], model="openai:fake", trials=1, seed=0
        )
        async with build_worker(client, store, fail_workflows_on_error=True):
            experiment_id = await run_experiment(client, store, config, lines.append)
    table = await load_table(store, experiment_id)
    rows = {row.arm: row for row in table.rows}
    assert list(rows) == list(ARMS)
    # debug and no-kb: the cheat is rejected, then the golden certifies; regenerate fails.
    assert {a: (r.successes, r.attempts) for a, r in rows.items()} == {
        "debug": (1, 1),
        "regenerate": (0, 1),
        "debug-no-kb": (1, 1),
        "debug-held-out-kb": (1, 1),
        "debug-no-integrity": (1, 1),
        "debug-compact-only": (1, 1),
    }
    assert rows["debug"].tokens == {"input": 2100, "cached_input": 400, "output": 220}
    assert rows["debug-held-out-kb"].tokens == rows["debug"].tokens
    assert rows["debug-no-integrity"].tokens == {"input": 1000, "cached_input": 400, "output": 100}
    assert rows["debug-compact-only"].tokens == {"input": 0, "cached_input": 0, "output": 0}
    assert rows["regenerate"].tokens == {"input": 700, "cached_input": 0, "output": 300}
    assert rows["regenerate"].tokens_per_success is None
    assert rows["debug"].uncached_per_operator == 2100 - 400 + 220
    assert table.only_debug == ["softmax_rows/floor_grid"]
    # The audits: every no-integrity success is the cheat, which the enforced gate rejects;
    # every compact-only success is the original, which fails the extended suite.
    audits = {a.arm: a for a in table.audits}
    assert (audits["debug-no-integrity"].audited, audits["debug-no-integrity"].rejected) == (1, 1)
    assert (audits["debug-compact-only"].audited, audits["debug-compact-only"].rejected) == (1, 1)
    for verdict in audits["debug-no-integrity"].verdicts:
        report = json.loads(await store.get_blob(verdict["report_hash"]))
        assert report["certified"] is False and verdict["violations"] == ["wrapper_compute"]
        assert report["integrity"]["mode"] == "enforce"
    for verdict in audits["debug-compact-only"].verdicts:
        assert verdict["extended_passed"] is False and verdict["failure_class"] == "boundary"

    # Every number traces to the sessions' own events.
    experiment = await store.read_stream(f"experiment-{experiment_id}")
    assert [e.type for e in experiment] == ["ExperimentStarted", "ExperimentFinished"]
    recorded = experiment[1].payload["arms"]
    for arm, cells in table.cells.items():
        cell = cells["softmax_rows/floor_grid"]
        assert recorded[arm]["softmax_rows/floor_grid"]["successes"] == cell.successes
        assert recorded[arm]["softmax_rows/floor_grid"]["tokens"] == cell.tokens.model_dump()
        kind = "KernelGenerated" if arm == "regenerate" else "FixProposed"
        logged = {"input": 0, "cached_input": 0, "output": 0}
        for sid in recorded[arm]["softmax_rows/floor_grid"]["sessions"]:
            events = await store.read_stream(sid)
            for key, value in session_tokens(events, kind).items():
                logged[key] += value
            if arm == "debug-no-integrity":
                started = events[0].payload
                assert started["integrity"] == "report" and started["learn"] is False
                assert any(e.type == "IntegrityViolated" for e in events)
            if arm == "debug-compact-only":
                certify = [e.payload for e in events if e.payload.get("phase") == "certify"]
                assert [c["suite"] for c in certify] == ["compact"]
            # The corpus's own entry (written from floor_grid's code) reaches the debug arm's
            # prompts, never the held-out arm's.
            retrieved = {
                i for e in events if e.type == "KnowledgeRetrieved" for i in e.payload["entry_ids"]
            }
            if arm == "debug":
                assert "seed-floor-grid-ragged" in retrieved, retrieved
            if arm == "debug-held-out-kb":
                assert events[0].payload["knowledge"] == "held_out"
                assert retrieved and "seed-floor-grid-ragged" not in retrieved, retrieved
        assert logged == cell.tokens.model_dump(), arm
    assert sum("audit" in line for line in lines) == 2 and any("[6/6]" in line for line in lines)

    # `nearmiss experiment show` recomputes the same table from the store, and writes the files.
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_address)
    monkeypatch.setenv("NEARMISS_DATABASE_URL", postgres_dsn)
    out = tmp_path / "table"
    printed = io.StringIO()
    with redirect_stdout(printed):
        args = parse(["experiment", "show", experiment_id, "--out", str(out)])
        assert await experiment_cli.run(args) == 0
    assert printed.getvalue() == markdown(table)
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(table.to_json()))
    assert (out / "table.md").read_text() == markdown(table)
    assert len(list(csv.DictReader((out / "table.csv").open()))) == 6
    # The table says which knowledge each arm's sessions could see.
    assert "| debug-held-out-kb | held out (own entries hidden) |" in markdown(table)
    assert "| debug | all |" in markdown(table) and "| debug-no-kb | none |" in markdown(table)
    for name in ("pass_rates.svg", "tokens_per_success.svg"):
        ET.parse(out / name)
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert await experiment_cli.run(parse(["experiment", "list", "--json"])) == 0
    assert json.loads(printed.getvalue())[0]["experiment_id"] == experiment_id


async def test_the_command_runs_a_playbook_experiment_on_configured_services(
    postgres_dsn, temporal_address, tmp_path, monkeypatch
):
    # The whole command as `nearmiss experiment` runs it: its own worker on the configured
    # services, the zero-token playbook (so no regenerate arm), files written, table printed.
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_address)
    monkeypatch.setenv("NEARMISS_DATABASE_URL", postgres_dsn)
    out = tmp_path / "playbook"
    argv = ["experiment", "--ops", "softmax_rows/floor_grid", "--arms", "debug,debug-compact-only"]
    argv += ["--trials", "1", "--out", str(out)]
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert await experiment_cli.run(parse(argv)) == 0
    text = printed.getvalue()
    assert text == (out / "table.md").read_text()
    assert "| debug | all | 100.0 % (1/1) | 100.0 % (1/1) | 0 | 0 | 0 |" in text
    assert "successes failing the extended suite (re-checked: extended suite): 1 of 1" in text
    assert "Operators only debug recovered" not in text  # no regenerate arm to compare with
