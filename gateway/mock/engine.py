"""The built-in OpenAI-compatible mock backend: deterministic answers, realistic pacing.

Used by the embedded default (``mock://`` backends, in process), by ``gateway mock-upstream``
(the same engine behind a real HTTP server), by the tests and by the load tests.

Knobs (milliseconds / tokens per second), from the ``mock://`` URL query, the
``mock-upstream`` CLI flags, or per request from ``x-mock-latency-ms``, ``x-mock-ttft-ms``,
``x-mock-tokens-per-s`` headers:

- ``latency_ms``: before the response headers;
- ``ttft_ms``: from the headers to the first content token;
- ``tokens_per_s``: pace of the following tokens (0 = as fast as possible).

A JSON answer takes what its stream would have: latency + ttft + tokens / tokens_per_s.
A model named ``mock-status-NNN`` answers with HTTP status NNN and an OpenAI error body.

>>> body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
>>> r = reply("POST", "/chat/completions", body)
>>> r.status, r.content_type
(200, 'application/json')
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import struct
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

MODELS = ("mock-gpt-4o", "mock-gpt-4o-mini", "mock-embedding-3-small")
DEFAULT_COMPLETION_TOKENS = 12
MAX_COMPLETION_TOKENS = 4096
EMBEDDING_DIMENSIONS = 1536  # text-embedding-3-small: ~30 KB of JSON per vector
_WORDS = (
    "the quick brown fox jumps over a lazy dog while gateways relay every token "
    "with honest latency spans traced from edge to upstream and back again through "
    "caches streams routers hops timelines budgets metrics logs models prompts answers "
    "fast lean bounded measured clear"
).split()


@dataclass(frozen=True, slots=True)
class MockSettings:
    latency_ms: float = 0.0
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0

    @classmethod
    def from_url(cls, url: str) -> MockSettings:
        """``mock://?ttft_ms=50&tokens_per_s=100`` → settings (unknown knobs are errors)."""
        return cls().with_overrides(dict(parse_qsl(urlsplit(url).query)))

    def with_overrides(self, values: Mapping[str, str]) -> MockSettings:
        known = {"latency_ms", "ttft_ms", "tokens_per_s"}
        changes: dict[str, float] = {}
        for key, raw in values.items():
            if key not in known:
                raise ValueError(f"unknown mock knob {key!r} (known: {', '.join(sorted(known))})")
            value = float(raw)
            if value < 0:
                raise ValueError(f"mock knob {key} must be >= 0")
            changes[key] = value
        return replace(self, **changes) if changes else self

    def from_headers(self, headers: Mapping[str, str]) -> MockSettings:
        values = {
            key: headers[h]
            for key, h in (
                ("latency_ms", "x-mock-latency-ms"),
                ("ttft_ms", "x-mock-ttft-ms"),
                ("tokens_per_s", "x-mock-tokens-per-s"),
            )
            if h in headers
        }
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


def _error(status: int, message: str, type_: str = "invalid_request_error") -> MockReply:
    body = orjson.dumps({"error": {"message": message, "type": type_, "code": None, "param": None}})
    return MockReply(status, "application/json", body)


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
    handlers = {"/chat/completions": _chat, "/completions": _completion, "/embeddings": _embed}
    handler = handlers.get(path)
    if handler is None:
        return _error(404, f"mock backend has no {method} {path}", "not_found_error")
    if method != "POST":
        return _error(405, f"use POST for {path}")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _error(400, "body is not valid JSON")
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
        return _error(400, "'model' is required")
    model: str = payload["model"]
    if model.startswith("mock-status-") and model[12:].isdigit():
        status = int(model[12:])
        return _error(status, f"mock backend answered {status} as asked", "mock_error")
    return handler(payload, model, settings)


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


def _completion_tokens(payload: dict[str, Any]) -> tuple[int, str]:
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return min(limit, MAX_COMPLETION_TOKENS), "length"
    return DEFAULT_COMPLETION_TOKENS, "stop"


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
    n_tokens, finish = _completion_tokens(payload)
    rng = _rng(model, messages)
    choices = [_text_tokens(rng, n_tokens) for _ in range(_choices(payload))]
    prompt_tokens = _count_words(messages) + 3 * len(messages)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n_tokens * len(choices),
        "total_tokens": prompt_tokens + n_tokens * len(choices),
    }
    ident = "chatcmpl-mock" + rng.getrandbits(64).to_bytes(8, "big").hex()
    created = int(time.time())
    if payload.get("stream") is True:
        events = _chat_events(ident, created, model, choices, finish, usage, payload, settings)
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
                "message": {"role": "assistant", "content": "".join(toks), "refusal": None},
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


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


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
) -> AsyncIterator[bytes]:
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

    yield b"".join(
        chunk(i, {"role": "assistant", "content": ""}, None) for i in range(len(choices))
    )
    async for t in _paced(settings, len(choices[0])):
        yield b"".join(chunk(i, {"content": toks[t]}, None) for i, toks in enumerate(choices))
    yield b"".join(chunk(i, {}, finish) for i in range(len(choices)))
    if with_usage:
        yield _sse(dict(base, choices=[], usage=usage))
    yield b"data: [DONE]\n\n"


def _completion(payload: dict[str, Any], model: str, settings: MockSettings) -> MockReply:
    prompt = payload.get("prompt")
    if not isinstance(prompt, str | list):
        return _error(400, "'prompt' must be a string or an array")
    n_tokens, finish = _completion_tokens(payload)
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

            def chunk(i: int, text: str, fr: str | None) -> bytes:
                obj = dict(
                    base,
                    choices=[{"index": i, "text": text, "logprobs": None, "finish_reason": fr}],
                )
                if with_usage:
                    obj["usage"] = None
                return _sse(obj)

            async for t in _paced(settings, n_tokens):
                yield b"".join(chunk(i, toks[t], None) for i, toks in enumerate(choices))
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
