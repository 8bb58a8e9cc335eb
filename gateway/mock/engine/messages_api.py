"""The Anthropic Messages API (and ``count_tokens``), with Anthropic's error shape; the stream
in the order Anthropic documents."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.mock.engine.generation import (
    _count_words,
    _output_length,
    _positive_int,
    _rng,
    _text_tokens,
    _turn_text,
    _words,
)
from gateway.mock.engine.knobs import MockSettings
from gateway.mock.engine.replies import (
    MockReply,
    _anthropic_error,
    _cut_after,
    _generation_time,
    _paced,
    _sent,
    _sse_event,
)
from gateway.mock.schema import fake, pieces
from gateway.mock.tools import Turn, messages_turn


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
