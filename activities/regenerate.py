"""The regenerate baseline's activity: a model writes the whole kernel from the spec.

``generate_kernel`` renders ``prompts/regenerate.md`` (the spec's source, its description, the
rules the engine enforces), makes one call through the openai fixer's plumbing (client, error
classification, token accounting) and takes the last fenced Python block that defines
``kernel`` as the file. An answer without one is a failed trial with its reason and its tokens,
never an exception; endpoint failures are retried by Temporal or stop the trial, as for fixes.
Certifying the kernel is ``check_candidate``'s job, exactly as for a repair.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import prompts
from activities.fixers.base import FixerError, to_activity_error
from activities.fixers.edits import EditError, full_file, summary_line
from activities.fixers.openai_fixer import complete, make_client, prompt_text
from activities.repair import stored_outcome, with_heartbeats
from kb.events import EventStore
from nearmiss.engine.inputs import parse_source
from workflows.models import FixResult, is_kind, model_argument
from workflows.regenerate import GeneratedKernel, GenerateInput


def spec_fields(spec_source: str) -> dict[str, str]:
    """The literal keyword arguments of the spec's ``OpSpec(...)`` call (description, category).

    Read from the source so the worker never imports the spec (nor JAX) to write a prompt.
    """
    try:
        tree = parse_source(spec_source)
    except SyntaxError:
        return {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "OpSpec":
            fields: dict[str, str] = {}
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    fields[keyword.arg] = value.value
            return fields
    return {}


def build_messages(request: GenerateInput, spec_source: str) -> list[dict[str, str]]:
    """One user message: the regenerate template filled from the spec."""
    fields = spec_fields(spec_source)
    text = prompts.render(
        "regenerate.md",
        op=request.kernel,
        category=fields.get("category", "unknown"),
        description=fields.get("description", "see the reference in the spec"),
        spec_path="spec.py",
        spec_source=spec_source.rstrip("\n"),
        candidate_name=request.candidate_name,
    )
    return [{"role": "user", "content": text.strip()}]


class OpenAIKernelGenerator:
    """Asks an OpenAI-compatible chat endpoint for a whole kernel file."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None):
        self.model = model
        self.client = make_client(base_url, api_key)

    async def aclose(self) -> None:
        await self.client.close()

    async def generate(self, request: GenerateInput, spec_source: str) -> FixResult:
        """The kernel file, or no source with the reason; tokens either way."""
        messages = build_messages(request, spec_source)
        completion, tokens, answer, why = await complete(
            self.client,
            self.model,
            messages,
            temperature=request.temperature,
            seed=request.seed,
        )
        common: dict[str, Any] = dict(
            model=f"openai:{self.model}", tokens=tokens, prompt=prompt_text(messages)
        )
        if answer is None:
            return FixResult(reason=why, **common)
        try:
            source = full_file(answer.replace("\r\n", "\n"))
        except EditError as exc:
            finish = getattr(completion.choices[0], "finish_reason", None)
            cut = " (the answer was cut off: finish_reason=length)" if finish == "length" else ""
            return FixResult(reason=exc.reason + cut, response=answer, **common)
        if not source.endswith("\n"):
            source += "\n"
        return FixResult(source=source, summary=summary_line(answer), response=answer, **common)


def make_generator(model: str) -> OpenAIKernelGenerator:
    """``openai:MODEL``, the endpoint and key found as for fixes (NEARMISS_OPENAI_* on top)."""
    if not is_kind(model, chat=True):
        raise ValueError(f"model {model!r} cannot write a kernel: regenerate needs openai:MODEL")
    return OpenAIKernelGenerator(model_argument(model))  # endpoint and key: make_client


class RegenerateActivities:
    def __init__(
        self,
        store: EventStore,
        generator_factory: Callable[[str], OpenAIKernelGenerator] = make_generator,
    ) -> None:
        self.store = store
        self.generator_factory = generator_factory

    @activity.defn(name="generate_kernel")
    async def generate_kernel(self, request: GenerateInput) -> GeneratedKernel:
        spec_source = (await self.store.get_blob(request.spec_hash)).decode()
        try:
            generator = self.generator_factory(request.model)
        except ValueError as exc:
            raise ApplicationError(str(exc), type="UsageError", non_retryable=True) from exc
        try:
            result = await with_heartbeats(generator.generate(request, spec_source))
        except FixerError as exc:
            raise to_activity_error(exc) from exc
        finally:
            await generator.aclose()
        outcome = await stored_outcome(self.store, result, request.model)
        # The trial's record: the outcome's texts by hash, without a fix's summary and flags.
        return GeneratedKernel.model_validate(
            outcome.model_dump(include=set(GeneratedKernel.model_fields))
        )

    def all(self) -> list:
        """The activities this baseline adds; checks and recording are the repair's own."""
        return [self.generate_kernel]
