"""The openai fixer with the real ``openai`` client against a scripted local HTTP endpoint.

Malformed bodies: a 200 whose body is not JSON at all is a transport failure (a proxy's error
page, a cut connection) and raises a retryable ``FixerError``; a JSON completion without choices
or content is the model's answer being empty, a failed round (``FixResult(source=None)``) with
whatever usage it reported.
"""

from __future__ import annotations

import socket
import threading
import time
from email.utils import formatdate
from pathlib import Path

import pytest
from fake_openai import (
    Answer,
    FakeOpenAI,
    Fault,
    answer,
    context_length,
    no_choices,
    not_json,
    rate_limited,
    server_error,
    slow,
    unauthorized,
)

from activities import prompts
from activities.fixers.base import FixerError
from activities.fixers.openai_fixer import (
    MAX_OUTPUT_TOKENS,
    MIN_OUTPUT_TOKENS,
    OpenAIFixer,
    answer_instruction,
    build_messages,
    estimated_tokens,
    retry_after_s,
)
from kb.knowledge import Entry
from nearmiss.engine.models import Evidence, Finding
from workflows.models import FixRequest, TokenUsage

SOURCE = """import jax
from jax.experimental import pallas as pl

BLOCK_R = 8


def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * {"scale": 1}["scale"]


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // BLOCK_R,),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
"""
GOOD = """The grid rounds down and skips the ragged tail; round it up with pl.cdiv.

<<<<<<< SEARCH
        grid=(rows // BLOCK_R,),
=======
        grid=(pl.cdiv(rows, BLOCK_R),),
>>>>>>> REPLACE
"""


def make_request(**evidence) -> FixRequest:
    fields = dict(
        candidate_hash="sha256:abc",
        suite="all",
        certified=False,
        failure_class="boundary",
        failure_classes=["boundary", "nan_inf"],
        integrity_ok=False,
        violations=[Finding(rule="wrapper_compute", detail="reduce_max outside at cand.py:9")],
        diagnosis="boundary: mismatches confined to the ragged tail along axis [0]\n  rows 40-44",
        compact_passed=True,
        extended_passed=False,
        cases_passed=2,
        cases_total=3,
        op="softmax_rows",
        category="reduction",
        platform="cpu",
        structure_problem="out is float32[64,256], the reference's is bfloat16[64,256]",
    )
    fields.update(evidence)
    return FixRequest(
        spec_path="pallas_ops/softmax_rows/spec.py",
        spec_source="SPEC = OpSpec(name='softmax_rows')  # {not_a_slot}\n",
        source=SOURCE,
        candidate_name="floor_grid",
        evidence=Evidence(**fields),
        round=3,
        tried=["recipe:cdiv_grid", "Mask the tail"],
        knowledge=["boundary × reduction: round the grid up with pl.cdiv and mask the tail"],
    )


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def fixers():
    made: list[OpenAIFixer] = []

    def make(base_url: str | None, **kw) -> OpenAIFixer:
        kw.setdefault("api_key", "test-key")
        made.append(OpenAIFixer("tiny-coder", base_url=base_url, **kw))
        return made[-1]

    yield make
    for fixer in made:
        await fixer.aclose()


async def fixer_error(fixer: OpenAIFixer) -> FixerError:
    with pytest.raises(FixerError) as info:
        await fixer.propose(make_request())
    return info.value


async def test_a_good_edit_is_applied_with_exact_tokens(fake, fixers):
    fake.script(answer(GOOD, prompt_tokens=1234, completion_tokens=56, cached_tokens=1024))
    fixer = fixers(fake.base_url)
    assert fixer.kind.name == "openai"
    result = await fixer.propose(make_request())
    assert result.source == SOURCE.replace("rows // BLOCK_R", "pl.cdiv(rows, BLOCK_R)")
    assert result.summary.startswith("The grid rounds down and skips the ragged tail")
    assert result.model == "openai:tiny-coder"
    assert result.tokens == TokenUsage(input=1234, cached_input=1024, output=56)
    assert result.tokens.uncached == 1234 - 1024 + 56
    assert result.response == GOOD and result.reason == ""
    [body] = fake.requests
    assert body["model"] == "tiny-coder" and body["temperature"] == 0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert fake.paths == ["/v1/chat/completions"]
    assert fake.headers[0]["authorization"] == "Bearer test-key"
    # The recorded prompt is exactly what was sent.
    for message in body["messages"]:
        assert f"### {message['role']}\n{message['content']}" in result.prompt


async def test_without_cached_tokens_cached_input_is_zero(fake, fixers):
    fake.script(answer(GOOD, prompt_tokens=10, completion_tokens=5, cached_tokens=None))
    result = await fixers(fake.base_url).propose(make_request())
    assert result.tokens == TokenUsage(input=10, cached_input=0, output=5)


async def test_the_prompt_carries_evidence_numbered_source_knowledge_and_history(fake, fixers):
    fake.script(answer(GOOD))
    await fixers(fake.base_url).propose(make_request())
    system, user = (m["content"] for m in fake.requests[0]["messages"])
    assert "<<<<<<< SEARCH" in system and ">>>>>>> REPLACE" in system
    assert "SPEC = OpSpec(name='softmax_rows')  # {not_a_slot}" in user
    assert "`floor_grid`, repair round 3" in user
    assert " 1 | import jax" in user
    assert "15 |         grid=(rows // BLOCK_R,)," in user
    assert ' 8 |     o_ref[...] = x_ref[...] * {"scale": 1}["scale"]' in user
    assert "Failure class: boundary (all seen: boundary, nan_inf)" in user
    assert "rows 40-44" in user and "ragged tail along axis [0]" in user
    assert "wrapper_compute: reduce_max outside at cand.py:9" in user
    assert "the reference's is bfloat16[64,256]" in user
    assert "Compact suite: passed; extended suite: FAILED" in user
    assert "2/3 cases pass" in user
    assert "- boundary × reduction: round the grid up with pl.cdiv and mask the tail" in user
    assert "- recipe:cdiv_grid" in user and "- Mask the tail" in user


def test_prompt_templates_have_every_slot_filled():
    user = build_messages(make_request(violations=[], integrity_ok=True))[1]["content"]
    assert "Integrity: ok" in user
    for slot in prompts.slots("fix.md"):
        assert "{" + slot + "}" not in user
    with pytest.raises(KeyError, match="spec_source"):
        prompts.render("fix.md", spec_path="x")
    empty = make_request()
    empty.knowledge, empty.tried = [], []
    user = build_messages(empty)[1]["content"]
    assert "(no matching entries)" in user and "(nothing yet)" in user


async def test_rate_limit_with_retry_after_is_retryable_without_sdk_retries(fake, fixers):
    fake.script(rate_limited(retry_after=7))
    error = await fixer_error(fixers(fake.base_url))
    assert error.retryable and error.retry_after_s == 7
    assert "429" in str(error)
    assert len(fake.requests) == 1  # max_retries=0: Temporal owns retries


async def test_rate_limit_with_retry_after_ms_and_http_date(fake, fixers):
    later = formatdate(time.time() + 30, usegmt=True)
    fake.script(rate_limited(retry_after_ms=1500), rate_limited(retry_after=later), rate_limited())
    fixer = fixers(fake.base_url)
    assert (await fixer_error(fixer)).retry_after_s == 1.5
    assert 25 <= (await fixer_error(fixer)).retry_after_s <= 30
    error = await fixer_error(fixer)
    assert error.retryable and error.retry_after_s is None


@pytest.mark.parametrize("status", [408, 409, 500, 502, 503])
async def test_transient_statuses_are_retryable(fake, fixers, status):
    fake.script(server_error(status))
    error = await fixer_error(fixers(fake.base_url))
    assert error.retryable and str(status) in str(error)


@pytest.mark.parametrize(
    "fault",
    [
        unauthorized(),
        Fault(403, {"error": {"message": "forbidden"}}),
        Fault(404, {"error": {"message": "The model `tiny-coder` does not exist"}}),
        Fault(422, "unprocessable"),
        Fault(400, {"error": {"message": "temperature is not supported", "code": None}}),
    ],
)
async def test_client_errors_are_not_retryable(fake, fixers, fault):
    fake.script(fault)
    error = await fixer_error(fixers(fake.base_url))
    assert not error.retryable and str(fault.status) in str(error)


@pytest.mark.parametrize("with_code", [True, False])
async def test_context_length_is_not_retryable(fake, fixers, with_code):
    fake.script(context_length(with_code=with_code))
    error = await fixer_error(fixers(fake.base_url))
    assert not error.retryable and str(error).startswith("context length exceeded")


async def test_a_slow_answer_beyond_the_timeout_is_retryable(fake, fixers):
    fake.script(slow(GOOD, delay_s=5))
    start = time.monotonic()
    error = await fixer_error(fixers(fake.base_url, timeout_s=0.5))
    assert error.retryable and "timed out" in str(error)
    assert time.monotonic() - start < 4


async def test_an_unreachable_endpoint_is_retryable(fixers):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = await fixer_error(fixers(f"http://127.0.0.1:{port}/v1"))
    assert error.retryable and "cannot reach" in str(error)


@pytest.mark.parametrize("content_type", ["application/json", "text/html"])
async def test_a_body_that_is_not_json_is_retryable(fake, fixers, content_type):
    fake.script(not_json(content_type))
    error = await fixer_error(fixers(fake.base_url))
    assert error.retryable and "not JSON" in str(error)


async def test_no_choices_is_a_failed_round_with_its_tokens(fake, fixers):
    fake.script(no_choices(prompt_tokens=77))
    result = await fixers(fake.base_url).propose(make_request())
    assert result.source is None and result.reason == "the endpoint returned no choices"
    assert result.tokens == TokenUsage(input=77)
    assert result.prompt and result.model == "openai:tiny-coder"


@pytest.mark.parametrize("content", [None, "", "  \n"])
async def test_empty_content_is_a_failed_round(fake, fixers, content):
    fake.script(Answer(content, prompt_tokens=90, completion_tokens=0, finish_reason="stop"))
    result = await fixers(fake.base_url).propose(make_request())
    assert result.source is None and "no content" in result.reason
    assert result.tokens.input == 90


async def test_an_edit_that_does_not_apply_is_a_failed_round_with_its_tokens(fake, fixers):
    bad = (
        "Fix it.\n<<<<<<< SEARCH\n    grid=(rows // 8,),\n=======\n    grid=(1,),\n>>>>>>> REPLACE"
    )
    fake.script(answer(bad, prompt_tokens=500, completion_tokens=30, cached_tokens=100))
    result = await fixers(fake.base_url).propose(make_request())
    assert result.source is None
    assert result.reason.startswith("SEARCH block 1 not found in the source")
    assert "'grid=(rows // 8,),'" in result.reason
    assert result.tokens == TokenUsage(input=500, cached_input=100, output=30)
    assert result.response == bad and result.prompt


async def test_a_truncated_answer_says_so(fake, fixers):
    cut = GOOD.split("=======")[0]
    fake.script(answer(cut, finish_reason="length"))
    result = await fixers(fake.base_url).propose(make_request())
    assert result.source is None
    assert "truncated" in result.reason and "finish_reason=length" in result.reason


async def test_an_exhausted_script_answers_500_clearly(fake, fixers):
    error = await fixer_error(fixers(fake.base_url))
    assert error.retryable and "script exhausted" in str(error)


async def test_env_vars_are_honoured_and_a_keyless_endpoint_gets_a_placeholder(
    fake, fixers, monkeypatch
):
    fake.script(answer(GOOD), answer(GOOD))
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    await fixers(None, api_key=None).propose(make_request())
    assert fake.headers[0]["authorization"] == "Bearer env-key"
    monkeypatch.delenv("OPENAI_API_KEY")
    await fixers(None, api_key=None).propose(make_request())
    assert fake.headers[1]["authorization"] == "Bearer no-key"


def test_retry_after_parsing():
    assert retry_after_s({"retry-after": "3"}) == 3
    assert retry_after_s({"retry-after": "0.25"}) == 0.25
    assert retry_after_s({"retry-after-ms": "200", "retry-after": "9"}) == 0.2
    assert retry_after_s({"retry-after": formatdate(time.time() - 60, usegmt=True)}) == 0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


async def test_the_fake_server_leaves_no_thread_or_socket():
    before = set(threading.enumerate())
    with FakeOpenAI() as server:
        server.script(slow("late", delay_s=30))
        port = server.port
        fixer = OpenAIFixer("m", base_url=server.base_url, api_key="k", timeout_s=0.3)
        with pytest.raises(FixerError):
            await fixer.propose(make_request())
        await fixer.aclose()
        start = time.monotonic()
    assert time.monotonic() - start < 2  # close woke the delayed step
    # The event loop's own executor (DNS lookups) may have started meanwhile; nothing else.
    extra = [t for t in set(threading.enumerate()) - before if not t.name.startswith("asyncio_")]
    assert extra == []
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


async def test_each_request_bounds_the_answer_by_the_budget_left(fake, fixers):
    fake.script(answer(GOOD), answer(GOOD), answer(GOOD))
    fixer = fixers(fake.base_url)
    for left in (None, 9000, 600):
        request = make_request()
        request.tokens_left = left
        result = await fixer.propose(request)
        assert result.model_requests == 1 and result.model_s > 0
    unbounded, bounded, nearly_spent = (body["max_tokens"] for body in fake.requests)
    assert unbounded == MAX_OUTPUT_TOKENS
    prompt = estimated_tokens(fake.requests[1]["messages"])
    assert prompt > 0 and bounded == 9000 - prompt  # what is left once the prompt is counted
    assert nearly_spent == MIN_OUTPUT_TOKENS  # less left than the prompt: the least answer
    assert all("max_completion_tokens" not in body for body in fake.requests)


async def test_an_endpoint_that_wants_max_completion_tokens_gets_it(fake, fixers):
    message = (
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead."
    )
    refusal = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "unsupported_parameter",
        }
    }
    fake.script(Fault(400, refusal), answer(GOOD), answer(GOOD))
    fixer = fixers(fake.base_url)
    first = await fixer.propose(make_request())
    assert first.source is not None and first.model_requests == 2 == len(fake.requests)
    refused, asked_again = fake.requests
    assert "max_tokens" in refused and "max_completion_tokens" not in refused
    assert asked_again["max_completion_tokens"] == refused["max_tokens"]
    assert "max_tokens" not in asked_again
    # The endpoint's answer is remembered: the next request asks with the right field at once.
    second = await fixer.propose(make_request())
    assert second.model_requests == 1 and "max_completion_tokens" in fake.requests[2]


async def test_knowledge_reaches_the_prompt_as_guidance_not_as_a_diff(fake, fixers):
    example = "-    o_ref[...] = acc\n+    @pl.when(pl.program_id(2) == 0)\n+    def _init():"
    entry = Entry(
        id="seed-acc",
        status="promoted",
        source="seed",
        title="Accumulator never zeroed",
        failure_class="nan_inf",
        category="matmul",
        platform="any",
        body={
            "diagnosis": "NaN in every output tile",
            "guidance": "zero the accumulator on the first reduction step",
            "example": example,
            "diff": example,
        },
    )
    fake.script(answer(GOOD))
    request = make_request()
    request.knowledge = [entry.line()]
    await fixers(fake.base_url).propose(request)
    user = fake.requests[0]["messages"][1]["content"]
    assert "- [seed-acc] Accumulator never zeroed. Seen as: NaN in every output tile" in user
    assert "Fix: zero the accumulator on the first reduction step" in user
    assert "pl.program_id(2) == 0" not in user and "o_ref[...] = acc" not in user
    assert not [line for line in user.splitlines() if line.startswith(("+", "-    "))]


async def test_plain_round_messages_agree_on_how_to_answer(fake, fixers):
    fake.script(answer(GOOD))
    await fixers(fake.base_url).propose(make_request())
    system, user = (m["content"] for m in fake.requests[0]["messages"])
    text = answer_instruction("text")
    assert text in system and text in user
    assert "propose_edit" not in system + user


def test_the_prompt_names_the_lines_an_input_the_evidence_names_reaches():
    """With a diagnosis that names inputs (x and y swapped), the model is shown the lines they
    reach, the body's parameters among them; a diagnosis that names none adds nothing."""
    here = Path(__file__).parent / "search"
    swapped = make_request(
        failure_class="wrong_values",
        diagnosis="wrong_values: ... The kernel's out is the reference's with x and y swapped "
        "(100.0% of its elements within tolerance of that): the kernel takes x for y.",
    ).model_copy(
        update={
            "source": (here / "axpy_swapped_refs.py").read_text(),
            "spec_source": (here / "axpy_spec.py").read_text(),
        }
    )
    user = build_messages(swapped)[1]["content"]
    body = next(
        n for n, line in enumerate(swapped.source.split("\n"), 1) if "def _axpy_body" in line
    )
    pointed = next(line for line in user.split("\n") if "Where the evidence points" in line)
    assert "x and y reach lines" in pointed and str(body) in pointed, pointed
    assert "Where the evidence points" not in build_messages(make_request())[1]["content"]


def test_the_prompt_lists_every_range_of_lines_the_named_input_reaches():
    """The search's answer names the first few ranges; the model, which reads the kernel by its
    numbered lines, is given them all (JAX's TPU flash attention: q reaches 90-odd lines in
    more ranges than the search's answer names)."""
    import importlib.util

    from activities.fixers.search.leads import evidence_lines
    from nearmiss.engine.forensics.localise import MAX_RANGES

    module = importlib.util.find_spec("jax.experimental.pallas.ops.tpu.flash_attention")
    assert module is not None and module.origin is not None
    source = Path(module.origin).read_text() + (
        "\n\ndef kernel(q, k, v):\n    return flash_attention(q, k, v, causal=True)\n"
    )
    spec = "def reference(q, k, v):\n    return q\n"
    diagnosis = "Nudging q[0, 0, 1, 2] (up by 8 times its rms) moves: the kernel ignores q."
    reached = evidence_lines(source, spec, diagnosis)
    assert "more ranges" in reached.describe()  # the search's answer: the first few
    request = make_request(failure_class="wrong_values", diagnosis=diagnosis).model_copy(
        update={"source": source, "spec_source": spec}
    )
    pointed = next(
        line
        for line in build_messages(request)[1]["content"].split("\n")
        if "Where the evidence points" in line
    )
    assert "more ranges" not in pointed and pointed.count(",") >= MAX_RANGES, pointed
    assert all(str(n) in pointed for n in (min(reached.lines), max(reached.lines)))
