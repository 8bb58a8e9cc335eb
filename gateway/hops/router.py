"""The router hop: parse the body once, validate it, pick the route, apply its policies.

Routes match the body's ``model`` against glob patterns (``fnmatch``, case-sensitive), first
matching route wins (docs/spec.md §4). The body is parsed exactly once here; it is re-serialised
only
when a policy changed it, otherwise the client's bytes go upstream untouched. What the body
means is the API's business (:mod:`gateway.protocols`).
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson

from gateway.context import Call, RequestContext
from gateway.errors import Forbidden, InvalidRequest, NotFound
from gateway.memo import remember
from gateway.protocols import BY_PATH
from gateway.protocols.responses import conversation_id
from gateway.routes import Route

_MATCH_CACHE_MAX = 10_000
#: a model name goes into spans, logs and metrics labels: no control characters (CR/LF), bounded
MAX_MODEL_CHARS = 256
_MODEL_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,%d}" % MAX_MODEL_CHARS)  # noqa: UP031


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object (400 ``invalid_json`` / ``invalid_body``)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(payload, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_body")
    return payload


class Router:
    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.routes = routes
        self._by_model: dict[str, Route | None] = {}

    def match(self, model: str) -> Route | None:
        try:
            return self._by_model[model]
        except KeyError:
            pass
        found = next((r for r in self.routes if r.matches(model)), None)
        # model names come from clients: the table is bounded
        return remember(self._by_model, model, found, _MATCH_CACHE_MAX)

    def route(self, ctx: RequestContext, body: bytes) -> Call:
        """Parse and validate ``body``, choose the route, apply its policies: ``ctx.call``."""
        api = BY_PATH[ctx.path]
        payload = json_object(body)
        api.validate(payload)
        model: str = payload["model"]
        if model not in self._by_model and not _MODEL_NAME.fullmatch(model):
            raise InvalidRequest(  # (a name seen before was checked then)
                f"'model' must be 1-{MAX_MODEL_CHARS} characters without control characters",
                code="invalid_model",
            )
        ctx.model = model
        if ctx.permits is not None and not ctx.permits(model):  # the key's model globs
            raise Forbidden(f"this API key may not call model {model!r}", code="model_not_allowed")
        route = self.match(model)
        if route is None:
            raise NotFound(f"no route for model {model!r}", code="model_not_found")
        call = Call(ctx.path, api.operation, body, payload, payload.get("stream") is True, route)
        cfg = route.config
        if cfg.max_tokens_cap is not None or cfg.history_window is not None:
            notes = api.apply_policies(payload, cfg, route.tokens_field)
            if notes:
                call.policies = notes
                call.body = orjson.dumps(payload)
        if api.stateful:  # the Responses API: a conversation may be named (docs/spec.md §7)
            ctx.conversation_id = conversation_id(payload)
        ctx.call = call
        ctx.timeline.routed = time.perf_counter()
        return call
