"""Session and fleet reports: a real repair session (real Temporal, PostgreSQL and checks)
rendered to HTML and Markdown, and a hand-written stream for what a real one rarely holds
(hostile text from a model, tool calls, token charts, an unfinished session)."""

from __future__ import annotations

import argparse
import base64
import re

import numpy as np
import pytest
from event_payloads import filled_event
from test_heatmap import decode_png

from conftest import MATMUL_SPEC, OPS
from nearmiss.cli import report as report_cli
from nearmiss.client.service import build_worker, start_session
from nearmiss.engine.forensics.localise import localise
from nearmiss.engine.models import CaseResult, CheckReport
from nearmiss.reports import (
    UnknownSession,
    load_session,
    write_fleet_report,
    write_session_report,
)
from nearmiss.reports.pages import md_text, render_session_html, render_session_markdown, slug
from workflows.loop import Guards

MISSING_INIT = OPS / "matmul" / "variants" / "missing_init.py"
PNG_URI = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    report_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", *argv])


async def test_a_real_repair_reports_its_map_diff_and_timeline(client, store, tmp_path, capsys):
    async with build_worker(client, store, fail_workflows_on_error=True):
        handle = await start_session(client, store, MATMUL_SPEC, MISSING_INIT, "playbook", Guards())
        result = await handle.result()
    assert result.certified
    fix = next(e.payload for e in await store.read_stream(handle.id) if e.type == "FixProposed")

    html_path = await write_session_report(store, handle.id, tmp_path / "one")
    html = html_path.read_text()
    assert html_path.name == f"{slug(handle.id)}.html" and "<script" not in html
    assert 'class="certified">certified' in html and "nan_inf" in html
    # The original's map: 128 × 128 output in 2 × 2 cells → 512 px, one 128 × 128 tile (TPU
    # tiling). The missing init fails everywhere, so there is no white cell to find.
    pictures = [decode_png(base64.b64decode(data)) for data in PNG_URI.findall(html)]
    assert pictures and pictures[0].shape == (512, 512, 3)
    assert not (pictures[0] == 255).all(axis=-1).any()
    assert "round 0 · candidate " in html and "compact/base · output " in html
    assert "128 × 128 output tiles" in html
    # The timeline tells the fix in words; the diff shows the zeroing the playbook added.
    assert f"proposed {fix['candidate_hash'].split(':')[1][:8]}: {fix['summary']}" in html
    assert re.search(r'<span class="add">\+\s+o_ref\[\.\.\.\] = jnp\.zeros', html), html
    assert "No model tokens were spent" in html  # the playbook costs nothing

    markdown = html_path.with_suffix(".md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", markdown)
    assert links and all((tmp_path / "one" / link).is_file() for link in links)
    assert "o_ref[...] = jnp.zeros" in markdown and fix["summary"] in markdown

    # The command: a known session writes and prints the paths; an unknown one is exit 2.
    assert await report_cli.run(_cli_args(handle.id, "--out", str(tmp_path / "cli")), store) == 0
    assert (tmp_path / "cli" / f"{slug(handle.id)}.html").is_file()
    assert await report_cli.run(_cli_args("repair-nope", "--out", str(tmp_path)), store) == 2
    assert "no repair session 'repair-nope'" in capsys.readouterr().err

    # A fleet: the table links each reported session; one with no record is still a row.
    index = await write_fleet_report(store, "night <run>", [handle.id, "lost"], tmp_path / "f")
    fleet = index.read_text()
    anchor = f"s-{slug(handle.id)}"
    assert f'href="#{anchor}"' in fleet and f'id="{anchor}"' in fleet
    assert "<title>night &lt;run&gt;</title>" in fleet and "no record" in fleet
    assert f'<a id="{anchor}"></a>' in index.with_suffix(".md").read_text()


# --- a hand-written stream ------------------------------------------------------------------


def _report(candidate: str, bad: np.ndarray) -> CheckReport:
    geometry = [{"outputs": [{"array_shape": list(bad.shape), "block_shape": [8, 64]}]}]
    case = CaseResult(
        suite="compact",
        name="base",
        dims={"R": bad.shape[0], "C": bad.shape[1]},
        dtype="float32",
        profile="normal",
        passed=False,
        failure_class="boundary",
        localisation=localise("out", bad, geometry),
        diagnosis="Mismatches only in the ragged tail.",
    )
    return CheckReport(
        op="softmax_rows",
        category="reduction",
        spec="spec.py",
        candidate=candidate,
        suite="compact",
        seed=0,
        platform="cpu",
        jax_version="0",
        certified=False,
        failure_class="boundary",
        cases=[case],
    )


async def _hand_written_session(store, finished: bool = True) -> str:
    original = await store.put_blob(b"def kernel(x):\n    return x\n")
    fixed = await store.put_blob(b"def kernel(x):\n    return x + 1  # <fixed>\n")
    bad = np.zeros((40, 100), dtype=bool)
    bad[:, 64:] = True
    report_hash = await store.put_blob(_report("k.py", bad).model_dump_json().encode())
    tokens = {"input": 1000, "cached_input": 600, "output": 300}
    events = [
        filled_event(
            "RepairStarted",
            {
                "kernel": "softmax_rows",
                "candidate_name": "k.py",
                "model": "openai:m",
                "candidate_hash": original,
                "guards": {"max_rounds": 6},
            },
        ),
        filled_event(
            "EvidenceCollected",
            {
                "phase": "forensics",
                "candidate_hash": original,
                "suite": "compact",
                "failure_class": "boundary",
                "score": 0.4,
                "report_hash": report_hash,
            },
        ),
        filled_event("KnowledgeRetrieved", {"round": 1, "entry_ids": ["seed-tail"], "patches": []}),
        filled_event(
            "ToolCalled",
            {
                "round": 1,
                "tool": "run_case",
                "arguments": '{"case": "<b>"}',
                "ran": True,
                "summary": "ran it",
            },
        ),
        filled_event(
            "FixProposed",
            {
                "round": 1,
                "model": "openai:m",
                "summary": "<script>alert(1)</script>",
                "candidate_hash": fixed,
                "tokens": tokens,
            },
        ),
    ]
    if finished:
        events.append(
            filled_event(
                "RepairFinished",
                {
                    "certified": True,
                    "rounds": 1,
                    "stop_reason": "certified",
                    "stop_detail": "ok",
                    "tokens": tokens,
                    "original_hash": original,
                    "final_hash": fixed,
                },
            )
        )
    await store.append("repair-hand", 0, events)
    return "repair-hand"


async def test_model_text_is_escaped_and_every_event_has_a_row(store, tmp_path):
    view = await load_session(store, await _hand_written_session(store))
    html = render_session_html(view)
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<span class="add">+    return x + 1  # &lt;fixed&gt;</span>' in html
    assert '<span class="del">-    return x</span>' in html
    assert [row.kind for row in view.timeline][3] == "ToolCalled"
    assert "experiment run_case({&quot;case&quot;: &quot;&lt;b&gt;&quot;}) → ran it" in html
    assert "knowledge used: seed-tail" in html and "cases 0/1 passed" in html
    # The token chart: one round, stacked cached / uncached input / output.
    assert "<svg" in html and "round 1: 600 tokens input, cached" in html
    assert "round 1: 400 tokens input, uncached" in html and "round 1: 300 tokens output" in html
    # 40 × 100 in 1 × 2 cells: 40 × 50 cells at 10 px; tile edges every 8 rows and 64 columns.
    (data,) = PNG_URI.findall(html)
    picture = decode_png(base64.b64decode(data))
    assert picture.shape == (400, 500, 3) and (picture[80, :] == 40).all()
    assert (picture[:, 320] == 40).all() and (picture[5, 5] == 255).all()

    markdown = render_session_markdown(view, tmp_path)
    assert "<script>" not in markdown and "&lt;script&gt;" in markdown
    assert (tmp_path / "repair-hand-map-1.png").is_file()
    assert "| 1 | 600 | 400 | 300 |" in markdown


async def test_an_unfinished_session_reports_so_and_an_unknown_one_raises(store):
    view = await load_session(store, await _hand_written_session(store, finished=False))
    assert view.verdict == "unfinished" and view.rounds == 1 and view.diff == ""
    assert 'class="unfinished"' in render_session_html(view)
    with pytest.raises(UnknownSession):
        await load_session(store, "repair-missing")


async def test_the_command_finds_the_store_from_settings_and_reports_a_fleet(
    store, postgres_dsn, tmp_path, monkeypatch, capsys
):
    session = await _hand_written_session(store)
    monkeypatch.setenv("NEARMISS_DATABASE_URL", postgres_dsn)
    monkeypatch.setenv("NEARMISS_HOME", str(tmp_path / "home"))
    # Several sessions make a fleet report, written under the state directory by default.
    assert await report_cli.main(_cli_args(session, "lost", "--title", "nightly")) == 0
    index = tmp_path / "home" / "reports" / "index.html"
    assert capsys.readouterr().out.splitlines()[0] == str(index)
    assert "<h1>nightly</h1>" in index.read_text() and "no record" in index.read_text()
    assert await report_cli.main(_cli_args("lost", "gone")) == 2
    assert "none of the 2 sessions" in capsys.readouterr().err


def test_a_fix_summary_with_carriage_returns_stays_in_its_table_cell():
    # A lone carriage return ends a line in CommonMark: a model's summary carrying them closed
    # the timeline's table and wrote its own heading, link and image after it.
    from markdown_it import MarkdownIt

    summary = "fix\r\r## Verdict: CERTIFIED\r![x](https://attacker.example/t.png)\x1b[2J"
    table = f"| round | summary |\n| --- | --- |\n| 1 | {md_text(summary)} |\n"
    html = MarkdownIt("commonmark").enable("table").render(table)
    assert "<h2>" not in html and "<img" not in html and "\x1b" not in html
    assert html.count("<tr>") == 2 and "Verdict: CERTIFIED" in html  # as text, in its cell
