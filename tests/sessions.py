"""Running repair sessions in tests: an in-process worker whose fixer is the real openai client
talking to the fake endpoint, and the sessions started the way `nearmiss repair` starts them."""

from __future__ import annotations

from pathlib import Path

from activities.fixers.openai_fixer import OpenAIFixer
from nearmiss.client.service import build_worker, start_session
from workflows.loop import Guards
from workflows.repair import RepairWorkflow

MODEL = "openai:fake-model"


def full_file(source: str) -> str:
    """A model's answer that rewrites the whole file."""
    return f"Rewrote the kernel.\n\n```python\n{source}```\n"


async def run_session(
    client, store, fake, spec: Path, candidate: Path, guards: Guards | None = None, use_kb=True
):
    """(result, the session's events, its last progress, its search attributes)."""

    def fixer_factory(model):
        return OpenAIFixer(model="fake-model", base_url=fake.base_url, api_key="test-key")

    async with build_worker(client, store, fixer_factory, fail_workflows_on_error=True):
        handle = await start_session(
            client, store, spec, candidate, MODEL, guards or Guards(), use_kb=use_kb
        )
        result = await handle.result()
        progress = await handle.query(RepairWorkflow.progress)
        attributes = (await handle.describe()).typed_search_attributes
    return result, await store.read_stream(handle.id), progress, attributes
