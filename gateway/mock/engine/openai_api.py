"""OpenAI's chat completions, completions and embeddings, as JSON or SSE."""

from __future__ import annotations

import base64
import random
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.mock.engine.generation import (
    _count_words,
    _positive_int,
    _rng,
    _text_tokens,
    _turn_text,
    _words,
)
from gateway.mock.engine.knobs import MAX_COMPLETION_TOKENS, MockSettings
from gateway.mock.engine.replies import (
    MockReply,
    _cut_after,
    _error,
    _generation_time,
    _paced,
    _sent,
    _sse,
)
from gateway.mock.schema import fake, pieces
from gateway.mock.tools import Turn, chat_turn

EMBEDDING_DIMENSIONS = 1536  # text-embedding-3-small: ~30 KB of JSON per vector


def _completion_tokens(payload: dict[str, Any], settings: MockSettings) -> tuple[int, str]:
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if _positive_int(limit):
        return min(limit, MAX_COMPLETION_TOKENS), "length"
    return settings.output_tokens, "stop"


def _choices(payload: dict[str, Any]) -> int:
    n = payload.get("n", 1)
    return n if isinstance(n, int) and 1 <= n <= 16 else 1


def _wants_usage(payload: dict[str, Any]) -> bool:
    opts = payload.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


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
