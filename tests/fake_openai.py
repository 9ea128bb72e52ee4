"""A scripted, OpenAI-compatible chat endpoint on 127.0.0.1 for tests (stdlib only).

    with FakeOpenAI() as fake:
        fake.script(answer("fix ...", prompt_tokens=900, cached_tokens=512), rate_limited(7))
        client = AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        ...
        fake.requests[0]["messages"]   # every request body, parsed (headers: fake.headers)

Each request to ``POST /v1/chat/completions`` (or ``/chat/completions``) takes the next step of
the script: an ``Answer`` (content and usage, optionally after a delay), a ``Fault`` (a status,
headers, a body) or ``Malformed`` (a 200 with a body that is not a completion). When the script
is used up the server answers 500 saying so. Every connection is closed after its response, and
``close`` wakes delayed steps, so leaving the ``with`` block leaves no thread or socket behind.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Answer:
    """A chat completion with ``content`` and exact usage numbers."""

    content: str | None
    prompt_tokens: int = 100
    completion_tokens: int = 20
    cached_tokens: int | None = None  # None: no prompt_tokens_details at all
    finish_reason: str = "stop"
    delay_s: float = 0.0
    # OpenAI tool calls: {"id", "name", "arguments"} (arguments a JSON string, sent verbatim).
    tool_calls: list[dict] | None = None


@dataclass
class Fault:
    """An HTTP error: ``status`` with ``headers`` and a JSON (dict) or raw (str) ``body``."""

    status: int
    body: dict | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Malformed:
    """A 200 whose body is not a usable completion (not JSON, no choices, ...)."""

    body: str | dict
    content_type: str = "application/json"


def answer(content: str | None, **kw) -> Answer:
    return Answer(content, **kw)


def slow(content: str, delay_s: float, **kw) -> Answer:
    return Answer(content, delay_s=delay_s, **kw)


_CALL_IDS = itertools.count(1)


def call(name: str, arguments: dict | str, call_id: str | None = None) -> dict:
    """One tool call for ``tool_answer``; a str ``arguments`` is sent as is (e.g. broken JSON)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call_id or f"call_{name}_{abs(hash(raw)) % 10**8}",
        "name": name,
        "arguments": raw,
    }


def tool_answer(*calls: dict, content: str | None = None, **kw) -> Answer:
    """An assistant turn that calls tools (finish_reason ``tool_calls``)."""
    return Answer(content, tool_calls=list(calls), finish_reason="tool_calls", **kw)


def _error(message: str, type_: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def rate_limited(retry_after: str | float | None = None, retry_after_ms: float | None = None):
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    body = _error("Rate limit reached for requests", "requests", "rate_limit_exceeded")
    return Fault(429, body, headers)


def server_error(status: int = 500) -> Fault:
    return Fault(status, _error("The server had an error processing your request.", "server_error"))


def unauthorized() -> Fault:
    return Fault(
        401, _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
    )


def tools_unsupported() -> Fault:
    """What vLLM/llama.cpp servers without tool support answer to a request with ``tools``."""
    message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'
    return Fault(400, _error(message, "BadRequestError"))


def context_length(with_code: bool = True) -> Fault:
    message = (
        "This model's maximum context length is 8192 tokens. However, your messages resulted in "
        "12000 tokens. Please reduce the length of the messages."
    )
    code = "context_length_exceeded" if with_code else None
    return Fault(400, _error(message, "invalid_request_error", code))


def not_json(content_type: str = "application/json") -> Malformed:
    return Malformed("<html>502 Bad Gateway</html>", content_type)


def no_choices(prompt_tokens: int = 50) -> Malformed:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
    return Malformed({"id": "chatcmpl-fake", "object": "chat.completion", "usage": usage})


class FakeOpenAI:
    """The server; see the module docstring. ``base_url`` ends in ``/v1``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._steps: deque = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        # Join handler threads on close (the stdlib default for this class is to leave them).
        self._server.daemon_threads = False
        self._server.block_on_close = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *steps: Answer | Fault | Malformed) -> FakeOpenAI:
        """Queue steps; each request takes the next one."""
        with self._lock:
            self._steps.extend(steps)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._steps)

    def start(self) -> FakeOpenAI:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="FakeOpenAI",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes delayed steps
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()  # joins the handler threads

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _next(self, body: dict, path: str, headers: dict[str, str]):
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
            self.headers.append(headers)
            n = len(self.requests)
            if self._steps:
                return self._steps.popleft()
        message = f"FakeOpenAI: script exhausted, request #{n} has no scripted step"
        return Fault(500, _error(message, "fake_script_exhausted"))


def _completion(step: Answer, model: str) -> dict:
    usage = {
        "prompt_tokens": step.prompt_tokens,
        "completion_tokens": step.completion_tokens,
        "total_tokens": step.prompt_tokens + step.completion_tokens,
    }
    if step.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": step.cached_tokens}
    message = {"role": "assistant", "content": step.content}
    if step.tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in step.tool_calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": step.finish_reason}],
        "usage": usage,
    }


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers
        timeout = 10  # a client that never sends its body cannot hold a thread forever

        def log_message(self, *args) -> None:  # quiet test output
            pass

        def _send(self, status: int, body: bytes, content_type: str, headers=None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up (timeout): nothing to answer
                pass

        def _json(self, status: int, payload, headers=None) -> None:
            if isinstance(payload, str):
                self._send(status, payload.encode(), "text/plain", headers)
            else:
                self._send(status, json.dumps(payload).encode(), "application/json", headers)

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path not in ("/v1/chat/completions", "/chat/completions"):
                self._json(404, _error(f"FakeOpenAI: no route POST {path}", "not_found"))
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                body = {"_raw": raw.decode("utf-8", "replace")}
            headers = {name.lower(): value for name, value in self.headers.items()}
            step = fake._next(body, path, headers)
            if getattr(step, "delay_s", 0) and fake._closing.wait(step.delay_s):
                return  # shutting down: drop the connection
            if isinstance(step, Answer):
                self._json(200, _completion(step, str(body.get("model", "fake"))))
            elif isinstance(step, Fault):
                self._json(step.status, step.body if step.body is not None else "", step.headers)
            else:
                payload = step.body if isinstance(step.body, str) else json.dumps(step.body)
                self._send(200, payload.encode(), step.content_type)

        def do_GET(self) -> None:
            self._json(404, _error(f"FakeOpenAI: no route GET {self.path}", "not_found"))

    return Handler
