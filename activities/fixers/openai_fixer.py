"""The ``openai`` fixer: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp).

One call per round, no retries of its own (``max_retries=0``: Temporal owns retries). HTTP
failures map to ``FixerError`` in one place, ``to_fixer_error``:

| failure                                              | retryable | retry_after_s          |
|------------------------------------------------------|-----------|------------------------|
| 408, 409, 429, any 5xx                               | yes       | Retry-After(-ms), if any |
| timeout, connection error                            | yes       | -                      |
| a 200 whose body is not JSON                         | yes       | -                      |
| 400 context length exceeded (code or message)        | no        | -                      |
| 400, 401, 403, 404, 422 and any other status         | no        | -                      |

A body that is JSON but has no choices or no content, and an answer whose edit does not apply,
are failed rounds: a ``FixResult`` without a source, with the reason and the tokens spent.

Every request bounds the answer's length (``output_limit``): by ``MAX_OUTPUT_TOKENS``, and by
what is left of the repair's token budget once the prompt is counted. The bound goes out as
``max_tokens``, which every OpenAI-compatible server reads; an endpoint that refuses it for
``max_completion_tokens`` (OpenAI's reasoning models) is asked again at once with that field,
and that field is used for the model from then on.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from activities import prompts
from activities.fixers.base import FixerError
from activities.fixers.edits import EditError, apply_answer, summary_line
from activities.fixers.search.leads import evidence_lines
from nearmiss.engine.models import Evidence
from workflows.models import FIXER_KINDS, FixRequest, FixResult, TokenUsage

# A keyless local endpoint (vLLM, Ollama) still needs some key for the SDK to start.
_PLACEHOLDER_KEY = "no-key"
_RETRYABLE_STATUS = {408, 409, 429}
_CONTEXT_LENGTH = re.compile(
    r"context[_ ]length|maximum context|context window|too many tokens|prompt is too long", re.I
)
# The longest answer asked for (a SEARCH/REPLACE edit, or a whole kernel, is far shorter), and
# the least, when the budget's estimate says less is left: a shorter answer is no answer.
MAX_OUTPUT_TOKENS = 16_384
MIN_OUTPUT_TOKENS = 256
CHARS_PER_TOKEN = 4  # to estimate a prompt's tokens before the endpoint counts them
# (base URL, model) -> the field that bounds an answer there, once an endpoint refused the other.
_LIMIT_FIELD: dict[tuple[str, str], str] = {}


def number_lines(source: str) -> str:
    """``source`` as the prompt shows it: ``  12 | code`` per line."""
    lines = source.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    width = max(3, len(str(len(lines))))
    return "\n".join(f"{i:>{width}} | {line}".rstrip() for i, line in enumerate(lines, 1))


def _suite_state(passed: bool | None) -> str:
    return "not run" if passed is None else ("passed" if passed else "FAILED")


def render_evidence(ev: Evidence) -> str:
    """The evidence as the prompt's bullet list."""
    cases = f"{ev.cases_passed}/{ev.cases_total} cases pass" if ev.cases_total else "no case ran"
    lines = [
        f"- Operator: {ev.op or '?'} (category {ev.category or '?'}), "
        f"platform {ev.platform or '?'}",
        f"- Checked on suite `{ev.suite}`: {cases}; "
        f"{'certified' if ev.certified else 'not certified'}",
        f"- Compact suite: {_suite_state(ev.compact_passed)}; "
        f"extended suite: {_suite_state(ev.extended_passed)}",
        f"- Failure class: {ev.failure_class or 'none'}"
        + (f" (all seen: {', '.join(ev.failure_classes)})" if ev.failure_classes else ""),
    ]
    if ev.structure_problem:
        lines.append(f"- Output structure: {ev.structure_problem}")
    if ev.speedup:
        lines.append(
            f"- Speed on the device: {ev.speedup:.2f}x the XLA reference's (geometric mean of the "
            f"cases; least in {ev.slowest_case}); a fix should not make it slower"
        )
    if ev.integrity_ok and not ev.violations:
        lines.append("- Integrity: ok")
    else:
        lines.append("- Integrity violations (these block certification whatever the numbers):")
        lines += [f"  - {v.rule}: {v.detail}" for v in ev.violations] or ["  - (unspecified)"]
    lines.append("- Diagnosis:")
    diagnosis = ev.diagnosis.strip() or "(none)"
    lines += [f"  {line}" for line in diagnosis.split("\n")]
    return "\n".join(lines)


# Every range of lines an input reaches (the search's own answer names the first few): the
# model reads the kernel by its numbered lines.
PROMPT_RANGES = 64


def where_the_evidence_points(request: FixRequest) -> str:
    """A bullet naming the lines the inputs the diagnosis names reach (``search.leads``), so
    a fix elsewhere is a choice the model makes knowingly; empty where it names none."""
    reached = evidence_lines(request.source, request.spec_source, request.evidence.diagnosis)
    if not reached:
        return ""
    return (
        f"\n- Where the evidence points: {reached.describe(most=PROMPT_RANGES)} of the kernel "
        "(from `kernel`'s parameter to the pallas_call operand, its index map and the body's "
        "ref). A fault every input shares (a mask, a loop bound) is on no one input's path: if "
        "your edit is elsewhere, say why in the summary."
    )


def _bullets(items: list[str], empty: str) -> str:
    return "\n".join(f"- {item}" for item in items) if items else empty


def answer_instruction(protocol: str = "text") -> str:
    """How the model is to answer, said alike in the system and the user message: with the
    edit as text, or (``"tools"``) by calling ``propose_edit``."""
    name = "answer_propose_edit.md" if protocol == "tools" else "answer_edit.md"
    return " ".join(prompts.render(name).split())


def build_messages(request: FixRequest, protocol: str = "text") -> list[dict[str, str]]:
    """The chat messages for one round, from the templates in ``activities/prompts``;
    ``protocol`` is how the model answers (``answer_instruction``)."""
    answer = answer_instruction(protocol)
    user = prompts.render(
        "fix.md",
        spec_path=request.spec_path,
        spec_source=request.spec_source.rstrip("\n"),
        candidate_name=request.candidate_name,
        round=request.round,
        numbered_source=number_lines(request.source),
        evidence=render_evidence(request.evidence) + where_the_evidence_points(request),
        knowledge=_bullets(request.knowledge, "(no matching entries)"),
        tried=_bullets(request.tried, "(nothing yet)"),
        answer=answer,
    )
    return [
        {"role": "system", "content": prompts.render("system.md", answer=answer).strip()},
        {"role": "user", "content": user.strip()},
    ]


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The messages as one string, for the round's record."""
    return "\n\n".join(f"### {m['role']}\n{m['content']}" for m in messages)


def retry_after_s(headers) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``Retry-After`` (seconds or an HTTP date)."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _is_context_length(exc: openai.APIStatusError) -> bool:
    error = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None
    code = error.get("code") if isinstance(error, dict) else getattr(exc, "code", None)
    return code == "context_length_exceeded" or bool(_CONTEXT_LENGTH.search(str(exc.message)))


def to_fixer_error(exc: Exception) -> FixerError:
    """The one place where endpoint failures become retryable or not."""
    if isinstance(exc, openai.APITimeoutError):
        return FixerError(f"model call timed out: {exc}", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return FixerError(f"cannot reach the model endpoint: {exc}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 400 and _is_context_length(exc):
            return FixerError(f"context length exceeded: {exc.message}", retryable=False)
        if status in _RETRYABLE_STATUS or status >= 500:
            return FixerError(
                f"model endpoint answered {status}: {exc.message}",
                retryable=True,
                retry_after_s=retry_after_s(exc.response.headers),
            )
        return FixerError(f"model endpoint answered {status}: {exc.message}", retryable=False)
    if isinstance(exc, json.JSONDecodeError):
        return FixerError(f"model endpoint sent a body that is not JSON: {exc}", retryable=True)
    return FixerError(f"model call failed: {type(exc).__name__}: {exc}", retryable=False)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_of(completion: object) -> TokenUsage:
    """Exact token counts from ``usage``; zeros for whatever the endpoint left out."""
    usage = getattr(completion, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    return TokenUsage(
        input=_count(getattr(usage, "prompt_tokens", 0)),
        cached_input=_count(getattr(details, "cached_tokens", 0)),
        output=_count(getattr(usage, "completion_tokens", 0)),
    )


def _answer_of(completion: object) -> tuple[str | None, str]:
    """(content, why there is none) of the first choice."""
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices:
        return None, "the endpoint returned no choices"
    choice = choices[0]
    content = getattr(getattr(choice, "message", None), "content", None)
    if not isinstance(content, str) or not content.strip():
        finish = getattr(choice, "finish_reason", None)
        return None, f"the model returned no content (finish_reason={finish})"
    return content, ""


def make_client(
    base_url: str | None = None, api_key: str | None = None, timeout_s: float = 120
) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` without retries of its own (Temporal owns retries).

    ``base_url``/``api_key`` None: NEARMISS_OPENAI_BASE_URL / NEARMISS_OPENAI_API_KEY when set,
    else the SDK reads OPENAI_BASE_URL / OPENAI_API_KEY itself.
    """
    base_url = base_url or os.environ.get("NEARMISS_OPENAI_BASE_URL")
    api_key = api_key or os.environ.get("NEARMISS_OPENAI_API_KEY")
    if api_key is None and not os.environ.get("OPENAI_API_KEY"):
        api_key = _PLACEHOLDER_KEY
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)


@dataclass
class Requests:
    """The chat requests one answer took (a refused one included) and their wall time."""

    sent: int = 0
    seconds: float = 0.0


def estimated_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """A prompt's tokens, roughly (``CHARS_PER_TOKEN``), before the endpoint counts them."""
    chars = sum(
        len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages
    )
    return chars // CHARS_PER_TOKEN


def output_limit(tokens_left: int | None, messages: Sequence[Mapping[str, Any]]) -> int:
    """The most tokens an answer may take: ``MAX_OUTPUT_TOKENS``, less where the budget left
    after the prompt is less (never under ``MIN_OUTPUT_TOKENS``, never over what is left)."""
    if tokens_left is None:
        return MAX_OUTPUT_TOKENS
    room = max(MIN_OUTPUT_TOKENS, tokens_left - estimated_tokens(messages))
    return max(1, min(MAX_OUTPUT_TOKENS, room, tokens_left))


def _wants_completion_field(exc: openai.APIStatusError) -> bool:
    """A 400 refusing ``max_tokens`` for ``max_completion_tokens`` (OpenAI's reasoning models:
    "Unsupported parameter: 'max_tokens' ... Use 'max_completion_tokens' instead.")."""
    return exc.status_code == 400 and "max_completion_tokens" in str(exc.message)


async def complete(
    client: openai.AsyncOpenAI,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    max_output: int | None = None,
    requests: Requests | None = None,
    **params,
) -> tuple[ChatCompletion, TokenUsage, str | None, str]:
    """One chat call: (completion, tokens, answer or None, why there is none).

    ``max_output``: the answer's bound (see the module's docstring); ``requests`` counts the
    requests sent and their time. Endpoint failures raise ``FixerError`` (retryable or not, see
    ``to_fixer_error``); an empty answer is not an error but ``None`` with its reason, so its
    tokens are still counted.
    """
    key = (str(client.base_url), model)
    field = _LIMIT_FIELD.get(key, "max_tokens")
    # Plain dicts, as the endpoint reads them; the SDK's TypedDicts are its spelling of them.
    sent = cast("list[ChatCompletionMessageParam]", list(messages))
    while True:
        limit: dict[str, Any] = {} if max_output is None else {field: max_output}
        started = time.monotonic()
        try:
            completion = await client.chat.completions.create(
                model=model, messages=sent, **limit, **params
            )
        except openai.APIStatusError as exc:
            if limit and field == "max_tokens" and _wants_completion_field(exc):
                field = _LIMIT_FIELD[key] = "max_completion_tokens"
                continue
            raise to_fixer_error(exc) from exc
        except (openai.APIError, json.JSONDecodeError) as exc:
            raise to_fixer_error(exc) from exc
        finally:
            if requests is not None:
                requests.sent += 1
                requests.seconds += time.monotonic() - started
        break
    if isinstance(completion, str):  # a 200 with a non-JSON content type: the SDK's text
        raise FixerError("model endpoint sent a body that is not JSON", retryable=True)
    answer, why = _answer_of(completion)
    return completion, usage_of(completion), answer, why


class OpenAIFixer:
    """Asks a chat model for a minimal SEARCH/REPLACE edit and applies it."""

    kind = FIXER_KINDS["openai"]

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120,
    ):
        self.model = model
        self.client = make_client(base_url, api_key, timeout_s)

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self.client.close()

    async def propose(self, request: FixRequest) -> FixResult:
        """One model call; the edited source, or a failed round with its reason and tokens."""
        messages = build_messages(request)
        prompt = prompt_text(messages)
        sent = Requests()
        completion, tokens, answer, why = await complete(
            self.client,
            self.model,
            messages,
            max_output=output_limit(request.tokens_left, messages),
            requests=sent,
            temperature=0,
        )
        common: dict[str, Any] = dict(
            model=f"openai:{self.model}",
            tokens=tokens,
            prompt=prompt,
            model_requests=sent.sent,
            model_s=round(sent.seconds, 3),
        )
        if answer is None:
            return FixResult(reason=why, response="", **common)
        try:
            source = apply_answer(request.source, answer)
        except EditError as exc:
            finish = getattr(completion.choices[0], "finish_reason", None)
            truncated = (
                " (the answer was cut off: finish_reason=length)" if finish == "length" else ""
            )
            return FixResult(reason=exc.reason + truncated, response=answer, **common)
        return FixResult(source=source, summary=summary_line(answer), response=answer, **common)
