"""The router hop: parse the body once, validate it, pick the route, apply its policies.

Routes match the body's ``model`` against glob patterns (``fnmatch``, case-sensitive), first
matching route wins (SPEC §4). The body is parsed exactly once here; it is re-serialised only
when a policy changed it, otherwise the client's bytes go upstream untouched.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.config import RouteConfig
from gateway.context import RequestContext
from gateway.errors import InvalidRequest, NotFound
from gateway.memo import remember

if TYPE_CHECKING:
    from gateway.hops.upstream import Backend

#: path -> GenAI operation name (gen_ai.operation.name)
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
_MATCH_CACHE_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Route:
    config: RouteConfig
    backends: tuple[Backend, ...]

    @property
    def name(self) -> str:
        return self.config.name

    def matches(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, p) for p in self.config.models)


class Router:
    def __init__(self, routes: tuple[RouteConfig, ...], backends: dict[str, Backend]) -> None:
        self.routes = tuple(Route(r, tuple(backends[name] for name in r.backends)) for r in routes)
        self._by_model: dict[str, Route | None] = {}

    def match(self, model: str) -> Route | None:
        try:
            return self._by_model[model]
        except KeyError:
            pass
        found = next((r for r in self.routes if r.matches(model)), None)
        # model names come from clients: the table is bounded
        return remember(self._by_model, model, found, _MATCH_CACHE_MAX)

    def route(self, ctx: RequestContext) -> None:
        """Parse and validate ``ctx.body``, choose ``ctx.route``, apply the route's policies."""
        operation = OPERATIONS[ctx.path]
        ctx.operation = operation
        try:
            payload = orjson.loads(ctx.body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(
                f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from exc
        if not isinstance(payload, dict):
            raise InvalidRequest("request body must be a JSON object", code="invalid_body")
        _validate(payload, operation)
        model: str = payload["model"]
        ctx.payload = payload
        ctx.model = model
        ctx.stream = payload.get("stream") is True
        route = self.match(model)
        if route is None:
            raise NotFound(f"no route for model {model!r}", code="model_not_found")
        ctx.route = route
        cfg = route.config
        if operation != "embeddings" and (
            cfg.max_tokens_cap is not None or cfg.history_window is not None
        ):
            notes = apply_policies(payload, cfg, operation)
            if notes:
                ctx.policies = notes
                ctx.body = orjson.dumps(payload)
        ctx.timeline.routed = time.perf_counter()


def apply_policies(payload: dict[str, Any], cfg: RouteConfig, operation: str) -> dict[str, Any]:
    """Apply ``max_tokens_cap`` and ``history_window`` in place; return what changed (SPEC §12)."""
    notes: dict[str, Any] = {}
    cap = cfg.max_tokens_cap
    if cap is not None:
        present = [k for k in ("max_tokens", "max_completion_tokens") if payload.get(k) is not None]
        for key in present:
            if payload[key] > cap:
                notes[f"policy.{key}"] = f"{payload[key]}->{cap}"
                payload[key] = cap
        if not present:
            # max_tokens is the field every OpenAI-compatible server (vLLM, Ollama, llama.cpp) knows
            payload["max_tokens"] = cap
            notes["policy.max_tokens"] = f"unset->{cap}"
    window = cfg.history_window
    if window is not None and operation == "chat":
        messages: list[Any] = payload["messages"]
        system = [m for m in messages if m.get("role") in ("system", "developer")]
        rest = [m for m in messages if m.get("role") not in ("system", "developer")]
        if len(rest) > window:
            kept = rest[-window:]
            # a tool result cannot open the window: its assistant tool_calls turn was cut off
            while kept and kept[0].get("role") == "tool":
                kept.pop(0)
            keep_ids = {id(m) for m in system} | {id(m) for m in kept}
            payload["messages"] = [m for m in messages if id(m) in keep_ids]
            notes["policy.history_window"] = f"{len(messages)}->{len(payload['messages'])}"
    return notes


_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed")
_NUM_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def _validate(payload: dict[str, Any], operation: str) -> None:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "'model' is required and must be a non-empty string", code="invalid_model"
        )
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", code="invalid_type")
    opts = payload.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise InvalidRequest("'stream_options' must be an object", code="invalid_type")
    for key in _INT_FIELDS:
        v = payload.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise InvalidRequest(f"'{key}' must be an integer", code="invalid_type")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        v = payload.get(key)
        if v is not None and v < 1:
            raise InvalidRequest(f"'{key}' must be at least 1", code="invalid_value")
    for key in _NUM_FIELDS:
        v = payload.get(key)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)):
            raise InvalidRequest(f"'{key}' must be a number", code="invalid_type")
    if operation == "chat":
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("'messages' must be a non-empty array", code="invalid_messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidRequest(
                    f"'messages[{i}]' must be an object with a string 'role'",
                    code="invalid_messages",
                )
    elif operation == "text_completion":
        if not isinstance(payload.get("prompt"), str | list):
            raise InvalidRequest("'prompt' must be a string or an array", code="invalid_prompt")
    elif not isinstance(payload.get("input"), str | list) or payload.get("input") in ("", []):
        raise InvalidRequest("'input' must be a non-empty string or array", code="invalid_input")
