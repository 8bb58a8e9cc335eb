"""Which generator answers a path: ``GET /models``, the special models (``mock-status-NNN``),
the request's JSON checked once, and a capacity's queue around the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.mock.capacity import Capacity
from gateway.mock.engine.knobs import MockSettings
from gateway.mock.engine.messages_api import _count_tokens, _messages
from gateway.mock.engine.openai_api import _chat, _completion, _embed
from gateway.mock.engine.replies import MockReply, _anthropic_error, _error
from gateway.mock.engine.responses_api import _responses

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
