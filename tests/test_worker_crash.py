"""A worker killed with SIGKILL mid-repair: a new worker finishes the repair, nothing recorded
twice, tokens exact. Real Temporal, real PostgreSQL, `nearmiss worker` processes, the openai
client against the fake endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from fake_openai import FakeOpenAI, answer
from sessions import MODEL, full_file

from conftest import OPS, ROOT
from kb.events import EventStore
from nearmiss.client.service import start_session
from workflows.loop import Guards

SOFTMAX = OPS / "softmax_rows"


def start_worker(env: dict, log, *options: str) -> subprocess.Popen:
    """`nearmiss worker OPTIONS` in its own process group, its output in ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "nearmiss.cli", "worker", *options],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_workers(*workers: subprocess.Popen | None) -> None:
    """SIGTERM every worker still running (its whole process group) and wait for it."""
    for worker in workers:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)


async def wait_for_event(store: EventStore, stream: str, kind: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e.type == kind for e in await store.read_stream(stream)):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {kind} event within {timeout_s} s")


async def test_a_killed_worker_is_replaced_and_the_repair_finishes_exactly_once(
    store, client, temporal_address, postgres_dsn, tmp_path
):
    with FakeOpenAI() as fake, open(tmp_path / "workers.log", "wb") as log:
        fake.script(
            answer(
                full_file((SOFTMAX / "variants" / "no_max_subtraction.py").read_text()),
                prompt_tokens=900,
                cached_tokens=400,
                completion_tokens=120,
            ),
            answer(
                full_file((SOFTMAX / "golden.py").read_text()),
                prompt_tokens=1100,
                completion_tokens=90,
            ),
        )
        env = dict(
            os.environ,
            TEMPORAL_ADDRESS=temporal_address,
            NEARMISS_DATABASE_URL=postgres_dsn,
            NEARMISS_OPENAI_BASE_URL=fake.base_url,
            NEARMISS_OPENAI_API_KEY="test-key",
        )
        first = start_worker(env, log)
        second = None
        try:
            handle = await start_session(
                client,
                store,
                SOFTMAX / "spec.py",
                SOFTMAX / "variants" / "floor_grid.py",
                MODEL,
                Guards(),
            )
            sid = handle.id
            # Kill it once the first fix is recorded: its validation check is then in flight.
            await wait_for_event(store, sid, "FixProposed", timeout_s=120)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            second = start_worker(env, log)
            result = await asyncio.wait_for(handle.result(), timeout=240)
        finally:
            stop_workers(first, second)
        served = len(fake.requests)
    events = await store.read_stream(sid)

    assert result.certified and result.rounds == 2, (result, (tmp_path / "workers.log").read_text())
    assert served == 2  # no model call was repeated
    assert result.tokens.model_dump() == {"input": 2000, "cached_input": 400, "output": 210}
    recorded = [e.payload["tokens"] for e in events if e.type == "FixProposed"]
    assert sum(t["input"] for t in recorded) == 2000 and len(recorded) == 2
    keys = [json.dumps([e.type, e.payload], sort_keys=True) for e in events]
    assert len(keys) == len(set(keys)), "an event was recorded twice"
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events][-1] == "RepairFinished"
