"""The built-in mock backend: deterministic answers, realistic pacing, five APIs.

Used by the embedded default (``mock://`` backends, in process), by ``gateway mock-upstream``
(the same engine behind a real HTTP server), by the tests and by the load tests.

Endpoints (paths after ``/v1``): ``/chat/completions``, ``/completions``, ``/embeddings``,
``/models`` (OpenAI), ``/responses`` (OpenAI Responses API), ``/messages`` and
``/messages/count_tokens`` (Anthropic Messages API, with Anthropic's error shape). Each answers
JSON, or SSE with ``"stream": true``, shaped as the official SDKs parse it; a Responses stream ends
after its terminal event (no ``[DONE]``), a Messages stream after ``event: message_stop``.

Knobs (milliseconds / tokens per second / tokens), from the ``mock://`` URL query, the
``mock-upstream`` CLI flags (``--latency-ms``, ``--ttft-ms``, ``--tokens-per-s``), or per request
from ``x-mock-latency-ms``, ``x-mock-ttft-ms``, ``x-mock-tokens-per-s``, ``x-mock-output-tokens``
headers (a bad value is a 400 in the endpoint's error shape):

- ``latency_ms``: before the response headers;
- ``ttft_ms``: from the headers to the first content token;
- ``tokens_per_s``: pace of the following tokens (0 = as fast as possible);
- ``output_tokens``: the length of an answer the request does not limit [12].

``capacity`` (``mock://?capacity=N``, ``--capacity N``; not per request) makes the mock a small
model server: at most N model calls run at once, the others wait in a queue, and ``/metrics``
reports them in vLLM's names (gateway/mock/capacity.py). Its answers' headers go out at once,
their bodies once the queue and the answer's own time are over.

A JSON answer takes what its stream would have: latency + ttft + tokens / tokens_per_s.
A stream sends its opening events with the headers, the first token after ``ttft_ms``, then one
event per token, then its closing events at once.

Length: chat/completions and completions answer exactly ``max_tokens`` (or
``max_completion_tokens``) tokens when given (finish_reason ``length``), else ``output_tokens``
(``stop``). Responses and Messages answer ``output_tokens`` tokens unless ``max_output_tokens`` /
``max_tokens`` is smaller, which cuts the answer there: status ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"``, or stop_reason ``max_tokens``.

Tools and structured outputs (gateway/mock/tools.py decides, gateway/mock/schema.py makes the
values), so agent frameworks' tool loops and ``parse`` helpers run on the mock:

- a request offering function tools (``tool_choice`` not ``none``) whose conversation does not
  end with tool results is answered with one call of the first tool (or the one ``tool_choice``
  names; an agent CLI's MCP tool, ``mcp__…``, before its own), its arguments made to fit the
  tool's JSON schema: chat ``tool_calls`` (finish_reason ``tool_calls``), a Responses
  ``function_call`` item (with its ``namespace`` for a namespace tool's function), a Messages
  ``tool_use`` block (stop_reason ``tool_use``); streamed as each API streams them, one
  argument piece per token. A tool call is always answered whole (the length limits do not cut
  it);
- a conversation ending with tool results is answered with text that quotes them
  ("The get_weather tool returned: …");
- a JSON answer asked for (chat ``response_format`` json_schema / json_object, Responses
  ``text.format``, Messages ``output_config.format``) is JSON valid for the schema (after tool
  results, its strings quote them).

These answers are deterministic per prompt like the text; their length is what they need.
Responses ids (``resp_…``, item and call ids) are unique per response (stateful requests find a
response by id); chat and Messages ids follow the prompt.

``GET /models`` lists :data:`MODELS` (the names the README uses); every other name is served
too. Models with a meaning (any other name is an ordinary model):

- ``mock-status-NNN``: answers HTTP status NNN with the endpoint's error body (OpenAI's shape;
  Anthropic's on ``/messages``, its ``error.type`` following the status: 400
  invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error,
  413 request_too_large, 429 rate_limit_error, 500 api_error, 529 overloaded_error, ...);
- ``mock-cut-N``: a stream that stops after N content tokens (fewer if the answer is shorter)
  and ends without its end marker: no finish chunk and no ``data: [DONE]`` (chat/completions,
  completions), no ``response.*.done`` / ``response.completed`` (responses), no
  ``content_block_stop`` / ``message_delta`` / ``message_stop`` (messages). A JSON request to
  it is answered normally.

>>> body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
>>> r = reply("POST", "/chat/completions", body)
>>> r.status, r.content_type
(200, 'application/json')
>>> r = reply("POST", "/messages", body)
>>> r.status, orjson.loads(r.body or b"")["error"]["message"]
(400, 'max_tokens: Field required')
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import math
import os
import random
import struct
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeGuard
from urllib.parse import parse_qsl, urlsplit

import orjson

from gateway.mock.capacity import Capacity, in_process
from gateway.mock.schema import fake, pieces
from gateway.mock.tools import Turn, chat_turn, messages_turn, responses_turn

#: what ``GET /models`` lists: the names the README's examples use (any other name is answered
#: too); the first chat model is the one ``gateway doctor`` picks
MODELS = (
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "o4-mini",
    "claude-sonnet-4",
    "claude-opus-4",
    "claude-3-5-haiku",
    "text-embedding-3-small",
    "text-embedding-3-large",
    # the names of earlier versions, which deploy/ configs and tests still use
    "mock-gpt-4o",
    "mock-gpt-4o-mini",
    "mock-embedding-3-small",
)
DEFAULT_COMPLETION_TOKENS = 12
MAX_COMPLETION_TOKENS = 4096
EMBEDDING_DIMENSIONS = 1536  # text-embedding-3-small: ~30 KB of JSON per vector
# one readable sentence, split once at import
_WORDS = (  # noqa: SIM905
    "the quick brown fox jumps over a lazy dog while gateways relay every token "
    "with honest latency spans traced from edge to upstream and back again through "
    "caches streams routers hops timelines budgets metrics logs models prompts answers "
    "fast lean bounded measured clear"
).split()


#: knob name → request header (the query keys of ``mock://`` are the knob names)
_KNOB_HEADERS = {
    "latency_ms": "x-mock-latency-ms",
    "ttft_ms": "x-mock-ttft-ms",
    "tokens_per_s": "x-mock-tokens-per-s",
    "output_tokens": "x-mock-output-tokens",
}


@dataclass(frozen=True, slots=True)
class MockSettings:
    latency_ms: float = 0.0
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    #: the length of an answer the request does not limit
    output_tokens: int = DEFAULT_COMPLETION_TOKENS
    #: a model server's bounded batch and queue (None: every request runs at once)
    capacity: Capacity | None = None

    @classmethod
    def from_url(cls, url: str) -> MockSettings:
        """``mock://?ttft_ms=50&tokens_per_s=100`` → settings (unknown knobs are errors);
        ``capacity=N`` names an in-process server with N slots (gateway/mock/capacity.py)."""
        values = dict(parse_qsl(urlsplit(url).query))
        if values.pop("capacity", None) is None:
            return cls().with_overrides(values)
        return cls(capacity=in_process(url)).with_overrides(values)

    def with_overrides(self, values: Mapping[str, str]) -> MockSettings:
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in _KNOB_HEADERS:
                known = ", ".join(sorted(_KNOB_HEADERS))
                raise ValueError(f"unknown mock knob {key!r} (known: {known})")
            if key == "output_tokens":
                try:
                    count = int(raw)
                except ValueError:
                    raise ValueError(f"mock knob {key} must be an integer") from None
                if not 1 <= count <= MAX_COMPLETION_TOKENS:
                    raise ValueError(f"mock knob {key} must be in 1..{MAX_COMPLETION_TOKENS}")
                changes[key] = count
                continue
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"mock knob {key} must be a number") from None
            if not 0 <= value < math.inf:
                raise ValueError(f"mock knob {key} must be a finite number >= 0")
            changes[key] = value
        return replace(self, **changes) if changes else self

    def from_headers(self, headers: Mapping[str, str]) -> MockSettings:
        values = {key: headers[h] for key, h in _KNOB_HEADERS.items() if h in headers}
        return self.with_overrides(values) if values else self


@dataclass(slots=True)
class MockReply:
    status: int
    content_type: str
    #: a JSON body, or None when ``events`` streams SSE
    body: bytes | None = None
    events: AsyncIterator[bytes] | None = None
    #: seconds to wait before the headers
    delay_s: float = 0.0


def _error(
    status: int, message: str, type_: str = "invalid_request_error", param: str | None = None
) -> MockReply:
    body = orjson.dumps(
        {"error": {"message": message, "type": type_, "code": None, "param": param}}
    )
    return MockReply(status, "application/json", body)


#: Anthropic's ``error.type`` per HTTP status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _anthropic_error(status: int, message: str) -> MockReply:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}``, as the Messages API."""
    type_ = _ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    body = {
        "type": "error",
        "error": {"type": type_, "message": message},
        "request_id": "req_mock" + os.urandom(12).hex(),
    }
    return MockReply(status, "application/json", orjson.dumps(body))


def bad_request(path: str, message: str) -> MockReply:
    """A 400 in the error shape of the API at ``path`` (e.g. for a bad ``x-mock-*`` header)."""
    if path.split("?", 1)[0].rstrip("/") in _ANTHROPIC_PATHS:
        return _anthropic_error(400, message)
    return _error(400, message)


def reply(method: str, path: str, body: bytes, settings: MockSettings | None = None) -> MockReply:
    """Answer one request; ``path`` is relative to the ``/v1`` base (``/chat/completions``)."""
    settings = settings or MockSettings()
    path = path.split("?", 1)[0].rstrip("/")
    if path == "/models" and method == "GET":
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "mock"} for m in MODELS]
        return MockReply(200, "application/json", orjson.dumps({"object": "list", "data": data}))
    if path.startswith("/models/") and method == "GET":
        model_id = path[len("/models/") :]
        return MockReply(
            200,
            "application/json",
            orjson.dumps({"id": model_id, "object": "model", "created": 0, "owned_by": "mock"}),
        )
    handler = _HANDLERS.get(path)
    if handler is None:
        return _error(404, f"mock backend has no {method} {path}", "not_found_error")
    anthropic = path in _ANTHROPIC_PATHS
    if method != "POST":
        if anthropic:
            return _anthropic_error(405, f"use POST for {path}")
        return _error(405, f"use POST for {path}")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        if anthropic:
            return _anthropic_error(400, "body is not valid JSON")
        return _error(400, "body is not valid JSON")
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
        if anthropic:
            return _anthropic_error(400, "model: Field required")
        return _error(400, "'model' is required")
    model: str = payload["model"]
    if model.startswith("mock-status-") and model[12:].isdigit():
        status = int(model[12:])
        if anthropic:
            return _anthropic_error(status, f"mock backend answered {status} as asked")
        return _error(status, f"mock backend answered {status} as asked", "mock_error")
    return _served(handler(payload, model, settings), settings.capacity, path)


def _served(r: MockReply, capacity: Capacity | None, path: str) -> MockReply:
    """With a capacity, a model server's answer: queued for a slot, generated in it (headers
    first, the body once generated: the wait is the queue's, then the answer's own time).
    Errors and token counts take no slot."""
    if capacity is None or r.status != 200 or path == "/messages/count_tokens":
        return r
    events = capacity.admitted(r.body, r.events, r.delay_s)
    return MockReply(r.status, r.content_type, events=events)


def _cut_after(model: str) -> int | None:
    """``mock-cut-N`` → N: its streams stop after N tokens, without their end marker."""
    if model.startswith("mock-cut-") and model[9:].isdigit():
        return int(model[9:])
    return None


# ---------------------------------------------------------------- generation


def _rng(model: str, prompt: Any) -> random.Random:
    return random.Random(hashlib.sha256(orjson.dumps([model, prompt])).digest())


def _text_tokens(rng: random.Random, n: int) -> list[str]:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _count_words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_count_words(v) for v in value)
    if isinstance(value, dict):
        return _count_words(value.get("content")) + _count_words(value.get("text"))
    return 0


def _completion_tokens(payload: dict[str, Any], settings: MockSettings) -> tuple[int, str]:
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if _positive_int(limit):
        return min(limit, MAX_COMPLETION_TOKENS), "length"
    return settings.output_tokens, "stop"


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _choices(payload: dict[str, Any]) -> int:
    n = payload.get("n", 1)
    return n if isinstance(n, int) and 1 <= n <= 16 else 1


def _wants_usage(payload: dict[str, Any]) -> bool:
    opts = payload.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def _generation_time(settings: MockSettings, tokens: int) -> float:
    pace = tokens / settings.tokens_per_s if settings.tokens_per_s else 0.0
    return settings.ttft_ms / 1000 + pace


def _chat(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return _error(400, "'messages' must be a non-empty array")
    try:
        turn = chat_turn(payload)
    except ValueError as exc:
        return _error(400, str(exc), param="tool_choice")
    rng = _rng(model, messages)
    call: tuple[str, str] | None = None
    if turn is None:
        n_tokens, finish = _completion_tokens(payload, settings)
        choices = [_text_tokens(rng, n_tokens) for _ in range(_choices(payload))]
    else:
        toks, finish, call = _chat_turn(payload, turn, rng)
        n_tokens, choices = len(toks), [toks] * _choices(payload)
    prompt_tokens = _count_words(messages) + 3 * len(messages)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n_tokens * len(choices),
        "total_tokens": prompt_tokens + n_tokens * len(choices),
    }
    ident = "chatcmpl-mock" + rng.getrandbits(64).to_bytes(8, "big").hex()
    created = int(time.time())
    if payload.get("stream") is True:
        events = _chat_events(
            ident, created, model, choices, finish, usage, payload, settings, call
        )
        return MockReply(
            200, "text/event-stream", events=events, delay_s=settings.latency_ms / 1000
        )
    body = {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": _chat_message("".join(toks), call),
                "logprobs": None,
                "finish_reason": finish,
            }
            for i, toks in enumerate(choices)
        ],
        "usage": usage,
        "system_fingerprint": "fp_mock",
    }
    delay = settings.latency_ms / 1000 + _generation_time(settings, n_tokens)
    return MockReply(200, "application/json", orjson.dumps(body), delay_s=delay)


def _chat_message(text: str, call: tuple[str, str] | None) -> dict[str, Any]:
    """The assistant message: ``text``, or the tool call (id, name) ``text`` is the arguments of."""
    if call is None:
        return {"role": "assistant", "content": text, "refusal": None}
    function = {"name": call[1], "arguments": text}
    return {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [{"id": call[0], "type": "function", "function": function}],
    }


def _chat_turn(
    payload: dict[str, Any], turn: Turn, rng: random.Random
) -> tuple[list[str], str, tuple[str, str] | None]:
    """(tokens, finish_reason, tool call) of a tool call or a text/JSON turn (docs: tools.py).

    A tool call is answered whole; other answers are cut by ``max_tokens`` (``length``).
    """
    if turn.call is not None:
        name, parameters = turn.call
        arguments = orjson.dumps(fake(parameters, _words(rng))).decode()
        call_id = "call_mock" + rng.getrandbits(96).to_bytes(12, "big").hex()
        return pieces(arguments), "tool_calls", (call_id, name)
    toks = pieces(_turn_text(turn, rng))
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if _positive_int(limit) and limit < len(toks):
        return toks[:limit], "length", None
    return toks, "stop", None


def _words(rng: random.Random) -> Callable[[], str]:
    """A source of a few words per free string of a made-up JSON value."""
    return lambda: "".join(_text_tokens(rng, 2))


def _turn_text(turn: Turn, rng: random.Random) -> str:
    """The text of an answer that is not a tool call: the tool results, or JSON for the schema
    (its strings saying the tool results when there are some)."""
    if turn.schema is None:
        return turn.results or ""
    said = turn.results
    words = _words(rng) if said is None else lambda: said
    return orjson.dumps(fake(turn.schema, words)).decode()


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _sent(count: int, cut: int | None) -> int:
    """How many of ``count`` tokens a stream sends (all, or the first N for ``mock-cut-N``)."""
    return count if cut is None else min(count, cut)


def _sse_event(name: str, obj: Any) -> bytes:
    """One SSE event with an ``event:`` line (Responses and Messages streams name their events)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


async def _paced(settings: MockSettings, count: int) -> AsyncIterator[int]:
    """Yield token indexes 0..count-1 at the configured TTFT and pace."""
    if settings.ttft_ms:
        await asyncio.sleep(settings.ttft_ms / 1000)
    interval = 1 / settings.tokens_per_s if settings.tokens_per_s else 0.0
    start = time.monotonic()
    for i in range(count):
        if i and interval:
            # pace against the clock, so sleep overshoot does not accumulate
            await asyncio.sleep(max(0.0, start + i * interval - time.monotonic()))
        yield i


async def _chat_events(
    ident: str,
    created: int,
    model: str,
    choices: list[list[str]],
    finish: str,
    usage: dict[str, int],
    payload: dict[str, Any],
    settings: MockSettings,
    call: tuple[str, str] | None = None,
) -> AsyncIterator[bytes]:
    """The chat stream; a tool call as OpenAI streams one: its id and name in the opening
    chunk (arguments ""), then one chunk per piece of the arguments."""
    base = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": "fp_mock",
    }
    with_usage = _wants_usage(payload)

    def chunk(index: int, delta: dict[str, Any], finish_reason: str | None) -> bytes:
        obj = dict(
            base,
            choices=[
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        )
        if with_usage:
            obj["usage"] = None
        return _sse(obj)

    if call is None:
        opening: dict[str, Any] = {"role": "assistant", "content": ""}

        def piece(token: str) -> dict[str, Any]:
            return {"content": token}
    else:
        head = {"index": 0, "id": call[0], "type": "function"}
        head["function"] = {"name": call[1], "arguments": ""}
        opening = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [head]}

        def piece(token: str) -> dict[str, Any]:
            return {"tool_calls": [{"index": 0, "function": {"arguments": token}}]}

    cut = _cut_after(model)
    yield b"".join(chunk(i, opening, None) for i in range(len(choices)))
    async for t in _paced(settings, _sent(len(choices[0]), cut)):
        yield b"".join(chunk(i, piece(toks[t]), None) for i, toks in enumerate(choices))
    if cut is not None:
        return  # mock-cut-N: no finish chunk, no usage, no [DONE]
    yield b"".join(chunk(i, {}, finish) for i in range(len(choices)))
    if with_usage:
        yield _sse(dict(base, choices=[], usage=usage))
    yield b"data: [DONE]\n\n"


def _completion(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    prompt = payload.get("prompt")
    if not isinstance(prompt, str | list):
        return _error(400, "'prompt' must be a string or an array")
    n_tokens, finish = _completion_tokens(payload, settings)
    rng = _rng(model, prompt)
    choices = [_text_tokens(rng, n_tokens) for _ in range(_choices(payload))]
    prompt_tokens = max(1, _count_words(prompt))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n_tokens * len(choices),
        "total_tokens": prompt_tokens + n_tokens * len(choices),
    }
    ident = "cmpl-mock" + rng.getrandbits(64).to_bytes(8, "big").hex()
    created = int(time.time())
    base = {"id": ident, "object": "text_completion", "created": created, "model": model}
    if payload.get("stream") is True:

        async def events() -> AsyncIterator[bytes]:
            with_usage = _wants_usage(payload)
            cut = _cut_after(model)

            def chunk(i: int, text: str, fr: str | None) -> bytes:
                obj = dict(
                    base,
                    choices=[{"index": i, "text": text, "logprobs": None, "finish_reason": fr}],
                )
                if with_usage:
                    obj["usage"] = None
                return _sse(obj)

            async for t in _paced(settings, _sent(n_tokens, cut)):
                yield b"".join(chunk(i, toks[t], None) for i, toks in enumerate(choices))
            if cut is not None:
                return  # mock-cut-N
            yield b"".join(chunk(i, "", finish) for i in range(len(choices)))
            if with_usage:
                yield _sse(dict(base, choices=[], usage=usage))
            yield b"data: [DONE]\n\n"

        return MockReply(
            200, "text/event-stream", events=events(), delay_s=settings.latency_ms / 1000
        )
    body = dict(
        base,
        choices=[
            {"index": i, "text": "".join(toks), "logprobs": None, "finish_reason": finish}
            for i, toks in enumerate(choices)
        ],
        usage=usage,
    )
    delay = settings.latency_ms / 1000 + _generation_time(settings, n_tokens)
    return MockReply(200, "application/json", orjson.dumps(body), delay_s=delay)


def _embed(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    raw = payload.get("input")
    if isinstance(raw, str):
        inputs: list[Any] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        inputs = [raw]  # one pre-tokenised input
    elif isinstance(raw, list) and raw:
        inputs = raw
    else:
        return _error(400, "'input' must be a string or a non-empty array")
    dims = payload.get("dimensions", EMBEDDING_DIMENSIONS)
    if not isinstance(dims, int) or not 1 <= dims <= 8192:
        return _error(400, "'dimensions' must be an integer in 1..8192")
    fmt = payload.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        return _error(400, "'encoding_format' must be 'float' or 'base64'")
    data = []
    for i, item in enumerate(inputs):
        rng = _rng(model, item)
        vector = [rng.uniform(-1.0, 1.0) for _ in range(dims)]
        # the openai SDK asks for base64 (little-endian float32) unless told otherwise
        encoded: Any = (
            base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
            if fmt == "base64"
            else vector
        )
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    tokens = sum(max(1, _count_words(x)) if isinstance(x, str) else len(x) for x in inputs)
    body = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return MockReply(
        200, "application/json", orjson.dumps(body), delay_s=settings.latency_ms / 1000
    )


# ---------------------------------------------------------------- OpenAI Responses API


def _output_length(limit: int | None, settings: MockSettings) -> tuple[int, bool]:
    """(tokens, cut short): ``output_tokens`` unless the request's limit is smaller."""
    natural = settings.output_tokens
    if limit is not None and limit < natural:
        return limit, True
    return natural, False


def _responses_invalid(payload: dict[str, Any]) -> MockReply | None:
    """The 400 the Responses API would answer for this request, if any."""
    raw = payload.get("input")
    if not (
        isinstance(raw, str)
        or (isinstance(raw, list) and raw and all(isinstance(x, dict) for x in raw))
    ):
        return _error(
            400, "'input' must be a string or a non-empty array of input items", param="input"
        )
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return _error(400, "'instructions' must be a string", param="instructions")
    limit = payload.get("max_output_tokens")
    if limit is not None and not _positive_int(limit):
        return _error(
            400, "'max_output_tokens' must be a positive integer", param="max_output_tokens"
        )
    temperature = _temperature(payload)
    if (
        not isinstance(temperature, int | float)
        or isinstance(temperature, bool)
        or not 0 <= temperature <= 2
    ):
        return _error(400, "'temperature' must be a number in 0..2", param="temperature")
    metadata = payload.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        return _error(400, "'metadata' must be an object of strings", param="metadata")
    return None


def _responses(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    invalid = _responses_invalid(payload)
    if invalid is not None:
        return invalid
    try:
        turn = responses_turn(payload)
    except ValueError as exc:
        return _error(400, str(exc), param="tool_choice")
    raw = payload["input"]
    instructions = payload.get("instructions")
    rng = _rng(model, [instructions, raw])
    tokens, incomplete, item = _responses_output(payload, turn, rng, settings)
    n_tokens = len(tokens)
    items = 1 if isinstance(raw, str) else len(raw)
    input_tokens = max(1, _count_words(raw) + _count_words(instructions) + 3 * items)
    usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": n_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + n_tokens,
    }
    # unique ids: a stateful response is found by its id (previous_response_id, GET /responses/…)
    response = _response_object(payload, "resp_mock" + _unique_hex(), model)
    status = "incomplete" if incomplete else "completed"
    if item is None:
        item = _message_item("msg_mock" + _unique_hex(), status, "".join(tokens))
    done = _responses_done(response, status, item, usage)
    if payload.get("stream") is True:
        events = _responses_events(response, done, tokens, _cut_after(model), settings)
        return MockReply(
            200, "text/event-stream", events=events, delay_s=settings.latency_ms / 1000
        )
    delay = settings.latency_ms / 1000 + _generation_time(settings, n_tokens)
    done["completed_at"] = int(time.time() + delay) if status == "completed" else None
    return MockReply(200, "application/json", orjson.dumps(done), delay_s=delay)


def _unique_hex() -> str:
    return os.urandom(24).hex()


def _responses_output(
    payload: dict[str, Any], turn: Turn | None, rng: random.Random, settings: MockSettings
) -> tuple[list[str], bool, dict[str, Any] | None]:
    """(tokens, cut short, the function_call item if the answer is one).

    Text is ``output_tokens`` words unless ``max_output_tokens`` is smaller; an answer of the
    turn (tools.py) is cut by ``max_output_tokens`` too, but a function call is answered whole.
    """
    limit = payload.get("max_output_tokens")
    if turn is None:
        n_tokens, incomplete = _output_length(limit, settings)
        return _text_tokens(rng, n_tokens), incomplete, None
    if turn.call is None:
        tokens = pieces(_turn_text(turn, rng))
        if limit is not None and limit < len(tokens):
            return tokens[:limit], True, None
        return tokens, False, None
    name, parameters = turn.call
    arguments = orjson.dumps(fake(parameters, _words(rng))).decode()
    item = {
        "id": "fc_mock" + _unique_hex(),
        "type": "function_call",
        "status": "completed",
        "call_id": "call_mock" + _unique_hex(),
        "name": name,
        "arguments": arguments,
    }
    if turn.namespace is not None:  # a function of a ``namespace`` tool says which
        item["namespace"] = turn.namespace
    return pieces(arguments), False, item


def _temperature(payload: dict[str, Any]) -> Any:
    value = payload.get("temperature")
    return 1.0 if value is None else value  # absent or null: the default


def _response_object(payload: dict[str, Any], ident: str, model: str) -> dict[str, Any]:
    """The fields a Response carries (openai.types.responses.Response); request values echoed."""

    def pick(key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = payload.get(key)
        return value if isinstance(value, kind) else default

    return {
        "id": ident,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": pick("parallel_tool_calls", bool, True),
        "previous_response_id": pick("previous_response_id", str, None),
        "prompt_cache_key": pick("prompt_cache_key", str, None),
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": pick("safety_identifier", str, None),
        "service_tier": "default",
        "store": pick("store", bool, True),
        "temperature": _temperature(payload),
        "text": pick("text", dict, {"format": {"type": "text"}, "verbosity": "medium"}),
        "tool_choice": pick("tool_choice", (str, dict), "auto"),
        "tools": pick("tools", list, []),
        "top_logprobs": 0,
        "top_p": pick("top_p", (int, float), 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": pick("user", str, None),
        "metadata": payload.get("metadata") or {},
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(msg_id: str, status: str, text: str) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [_output_text(text)],
    }


def _responses_done(
    response: dict[str, Any], status: str, item: dict[str, Any], usage: dict[str, Any]
) -> dict[str, Any]:
    """The finished Response: ``completed``, or ``incomplete`` (cut by max_output_tokens)."""
    return dict(
        response,
        status=status,
        incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
        output=[item],
        usage=usage,
    )


_Event = Callable[..., bytes]


async def _responses_events(
    response: dict[str, Any],
    done: dict[str, Any],
    tokens: list[str],
    cut: int | None,
    settings: MockSettings,
) -> AsyncIterator[bytes]:
    """The Responses API stream: named events with a running ``sequence_number``."""
    sequence = itertools.count()

    def event(type_: str, **fields: Any) -> bytes:
        return _sse_event(type_, {"type": type_, "sequence_number": next(sequence), **fields})

    item = done["output"][0]
    yield event("response.created", response=response)
    yield event("response.in_progress", response=response)
    deltas = _call_deltas if item["type"] == "function_call" else _text_deltas
    async for chunk in deltas(event, item, tokens, cut, settings):
        yield chunk
    if cut is not None:
        return  # mock-cut-N: no *.done, no response.completed
    yield event("response.output_item.done", output_index=0, item=item)
    if done["status"] == "completed":
        done = dict(done, completed_at=int(time.time()))
        yield event("response.completed", response=done)
    else:
        yield event("response.incomplete", response=done)


async def _text_deltas(
    event: _Event, item: dict[str, Any], tokens: list[str], cut: int | None, settings: MockSettings
) -> AsyncIterator[bytes]:
    """A message item: added, its text part, one delta per token, then its part done."""
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    added = dict(item, status="in_progress", content=[])
    yield event("response.output_item.added", output_index=0, item=added)
    yield event("response.content_part.added", **where, part=_output_text(""))
    async for t in _paced(settings, _sent(len(tokens), cut)):
        yield event("response.output_text.delta", **where, delta=tokens[t], logprobs=[])
    if cut is None:
        part = item["content"][0]
        yield event("response.output_text.done", **where, text=part["text"], logprobs=[])
        yield event("response.content_part.done", **where, part=part)


async def _call_deltas(
    event: _Event, item: dict[str, Any], tokens: list[str], cut: int | None, settings: MockSettings
) -> AsyncIterator[bytes]:
    """A function_call item: added with empty arguments, one delta per piece, then done."""
    where = {"item_id": item["id"], "output_index": 0}
    added = dict(item, status="in_progress", arguments="")
    yield event("response.output_item.added", output_index=0, item=added)
    async for t in _paced(settings, _sent(len(tokens), cut)):
        yield event("response.function_call_arguments.delta", **where, delta=tokens[t])
    if cut is None:
        yield event(
            "response.function_call_arguments.done",
            **where,
            name=item["name"],
            arguments=item["arguments"],
        )


# ---------------------------------------------------------------- Anthropic Messages API


def _anthropic_prompt(payload: dict[str, Any]) -> tuple[Any, Any, int] | MockReply:
    """Validate ``messages`` and ``system`` → (messages, system, input tokens) or the 400."""
    messages = payload.get("messages")
    if messages is None:
        return _anthropic_error(400, "messages: Field required")
    if not isinstance(messages, list):
        return _anthropic_error(400, "messages: Input should be a valid list")
    if not messages:
        return _anthropic_error(400, "messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return _anthropic_error(
                400, f"messages.{i}.role: Input should be 'user' or 'assistant'"
            )
        if not isinstance(message.get("content"), str | list):
            return _anthropic_error(
                400, f"messages.{i}.content: Input should be a valid string or list"
            )
    system = payload.get("system")
    if system is not None and not isinstance(system, str | list):
        return _anthropic_error(400, "system: Input should be a valid string or list")
    input_tokens = max(1, _count_words(messages) + _count_words(system) + 3 * len(messages))
    return messages, system, input_tokens


def _messages(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    max_tokens = payload.get("max_tokens")
    if max_tokens is None:
        return _anthropic_error(400, "max_tokens: Field required")
    if not _positive_int(max_tokens):
        return _anthropic_error(400, "max_tokens: Input should be an integer >= 1")
    prompt = _anthropic_prompt(payload)
    if isinstance(prompt, MockReply):
        return prompt
    try:
        turn = messages_turn(payload)
    except ValueError as exc:
        return _anthropic_error(400, f"tool_choice: {exc}")
    messages, system, input_tokens = prompt
    rng = _rng(model, [system, messages])
    tokens, stop_reason, block = _messages_output(turn, rng, max_tokens, settings)
    message: dict[str, Any] = {
        "id": "msg_mock" + rng.getrandbits(96).to_bytes(12, "big").hex(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": len(tokens),
        },
    }
    if payload.get("stream") is True:
        events = _messages_events(message, block, tokens, stop_reason, _cut_after(model), settings)
        return MockReply(
            200, "text/event-stream", events=events, delay_s=settings.latency_ms / 1000
        )
    body = dict(message, content=[block], stop_reason=stop_reason)
    delay = settings.latency_ms / 1000 + _generation_time(settings, len(tokens))
    return MockReply(200, "application/json", orjson.dumps(body), delay_s=delay)


def _messages_output(
    turn: Turn | None, rng: random.Random, max_tokens: int, settings: MockSettings
) -> tuple[list[str], str, dict[str, Any]]:
    """(tokens, stop_reason, the content block): text of ``output_tokens`` words unless
    ``max_tokens`` is smaller, the turn's answer (tools.py) cut by it too, or a whole tool_use."""
    if turn is None:
        n_tokens, cut_short = _output_length(max_tokens, settings)
        tokens = _text_tokens(rng, n_tokens)
    elif turn.call is None:
        tokens = pieces(_turn_text(turn, rng))
        cut_short = max_tokens < len(tokens)
        tokens = tokens[:max_tokens]
    else:
        name, schema = turn.call
        value = fake(schema, _words(rng))
        ident = "toolu_mock" + rng.getrandbits(96).to_bytes(12, "big").hex()
        block = {"type": "tool_use", "id": ident, "name": name, "input": value}
        return pieces(orjson.dumps(value).decode()), "tool_use", block
    text = {"type": "text", "text": "".join(tokens)}
    return tokens, "max_tokens" if cut_short else "end_turn", text


async def _messages_events(
    message: dict[str, Any],
    block: dict[str, Any],
    tokens: list[str],
    stop_reason: str,
    cut: int | None,
    settings: MockSettings,
) -> AsyncIterator[bytes]:
    """The Messages stream, in the order Anthropic documents (streaming messages guide); a
    tool_use block starts with an empty ``input`` and streams it as ``input_json_delta``s."""

    def event(type_: str, **fields: Any) -> bytes:
        return _sse_event(type_, {"type": type_, **fields})

    def delta(token: str) -> dict[str, Any]:
        if block["type"] == "tool_use":
            return {"type": "input_json_delta", "partial_json": token}
        return {"type": "text_delta", "text": token}

    # message_start carries the input tokens; output_tokens counts up to message_delta's total
    start_usage = dict(message["usage"], output_tokens=1)
    yield event("message_start", message=dict(message, usage=start_usage))
    opening = dict(block, input={}) if block["type"] == "tool_use" else dict(block, text="")
    yield event("content_block_start", index=0, content_block=opening)
    yield event("ping")
    async for t in _paced(settings, _sent(len(tokens), cut)):
        yield event("content_block_delta", index=0, delta=delta(tokens[t]))
    if cut is not None:
        return  # mock-cut-N: no content_block_stop, message_delta, message_stop
    yield event("content_block_stop", index=0)
    yield event(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage={"output_tokens": len(tokens)},
    )
    yield event("message_stop")


def _count_tokens(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    """``POST /v1/messages/count_tokens`` → ``{"input_tokens": N}`` (as the Messages answer)."""
    prompt = _anthropic_prompt(payload)
    if isinstance(prompt, MockReply):
        return prompt
    body = orjson.dumps({"input_tokens": prompt[2]})
    return MockReply(200, "application/json", body, delay_s=settings.latency_ms / 1000)


_Handler = Callable[[dict[str, Any], str, MockSettings], MockReply]
_HANDLERS: dict[str, _Handler] = {
    "/chat/completions": _chat,
    "/completions": _completion,
    "/embeddings": _embed,
    "/responses": _responses,
    "/messages": _messages,
    "/messages/count_tokens": _count_tokens,
}
#: answered with Anthropic's error shape
_ANTHROPIC_PATHS = frozenset({"/messages", "/messages/count_tokens"})
