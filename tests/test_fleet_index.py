"""A fleet report's index opens with one summary line above its table (HTML and Markdown):
certified n/N, tokens, wall time, and per target how many sessions it accepted."""

from __future__ import annotations

import asyncio
from html import unescape

from event_payloads import filled_event

from nearmiss.reports import write_fleet_report
from nearmiss.reports.session import _duration

TOKENS = [
    {"input": 1000, "cached_input": 600, "output": 300},
    {"input": 2000, "cached_input": 0, "output": 500},
]


async def _session(store, stream: str, certified: bool, tokens: dict, targets: dict) -> None:
    await store.append(
        stream,
        0,
        [
            filled_event(
                "RepairStarted",
                {"kernel": stream, "candidate_name": "k.py", "candidate_hash": "sha256:a"},
            )
        ],
    )
    await asyncio.sleep(0.3)  # the wall time spans the sessions' events
    finished = {
        "certified": certified,
        "rounds": 1,
        "stop_reason": "certified" if certified else "max_rounds",
        "stop_detail": "",
        "tokens": tokens,
        "original_hash": "sha256:a",
        "final_hash": "sha256:a",
        "targets": targets,
    }
    await store.append(stream, 1, [filled_event("RepairFinished", finished)])


async def test_the_index_opens_with_a_summary_line(store, tmp_path):
    await _session(store, "repair-one", True, TOKENS[0], {"interpret": True, "tpu-v5e": True})
    await _session(store, "repair-two", False, TOKENS[1], {"interpret": False})
    ids = ["repair-one", "repair-two", "repair-lost"]
    index = await write_fleet_report(store, "nightly", ids, tmp_path)

    first = (await store.read_stream("repair-one"))[0].recorded_at
    last = (await store.read_stream("repair-two"))[-1].recorded_at
    wall = _duration((last - first).total_seconds())
    expected = (
        "certified 1/3 · tokens 3,800 (3,200 uncached) · "
        f"wall time {wall} · targets: interpret 1/2 ok, tpu-v5e 1/1 ok"
    )
    markdown = (tmp_path / "index.md").read_text().splitlines()
    assert markdown[:4] == ["# nightly", "", expected, ""]
    assert markdown[4].startswith("| kernel |")

    html = index.read_text()
    summary_at, table_at = html.index('<p class="summary">'), html.index("<table>")
    assert summary_at < table_at
    shown = html[summary_at:].split(">", 1)[1].split("</p>", 1)[0]
    assert unescape(shown) == expected


async def test_a_fleet_with_no_record_says_so(store, tmp_path):
    await write_fleet_report(store, "empty", ["repair-none"], tmp_path)
    line = (tmp_path / "index.md").read_text().splitlines()[2]
    assert line == "certified 0/1 · tokens 0 (0 uncached) · wall time - · targets: none judged"


def test_durations_read_as_people_write_them():
    assert [_duration(s) for s in (0.4, 59.6, 185, 7620)] == [
        "0 s",
        "1 min 00 s",
        "3 min 05 s",
        "2 h 07 min",
    ]
