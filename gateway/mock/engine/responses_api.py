"""The OpenAI Responses API: a Response object, or its stream of named events with a running
``sequence_number``; ids unique per response (stateful requests find a response by id)."""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import AsyncIterator, Callable
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
    _cut_after,
    _error,
    _generation_time,
    _paced,
    _sent,
    _sse_event,
)
from gateway.mock.schema import fake, pieces
from gateway.mock.tools import Turn, responses_turn


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
