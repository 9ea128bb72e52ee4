"""Regenerate the saved workflow histories that tests/test_replay.py replays.

    .venv/bin/python tests/make_histories.py

Runs three short repairs on a private dev stack with a scripted fixer (the replay only needs the
activities' recorded results) and writes their histories as JSON to tests/histories/. Re-run it
after an intended change to the workflow's command sequence, and keep old histories that must
still replay (a change that breaks them needs workflow.patched): the *_before_kb.json ones
predate knowledge retrieval and learning and replay through their patches.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from conftest import OPS, ROOT, private_stack
from infra.devstack import DevStack, PostgresService
from kb.events import EventStore
from kb.knowledge import load_seed
from nearmiss.service import build_worker, connect, start_session
from nearmiss.settings import Settings
from workflows.loop import Guards
from workflows.models import FixResult

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


async def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        config = private_stack(Path(home))
        settings = Settings(config.temporal_address, config.connect_dsn, True, config)
        with DevStack(config):
            store = await EventStore.connect(config.connect_dsn)
            await load_seed(store)
            client = await connect(settings)
            for name, (candidate, script, guards) in SESSIONS.items():
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
                    history = await handle.fetch_history()
                    (OUT / f"{name}.json").write_text(history.to_json())
            await store.close()
        PostgresService(config).remove_data()


if __name__ == "__main__":
    asyncio.run(main())
