"""The endpoints other than the model call (docs/spec.md §5): models, passthrough, health,
readiness."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.hops.edge import stream_body
from gateway.hops.ownership import response_path_id
from gateway.routes import Backend
from gateway.runtime import Endpoint, Runtime
from gateway.streaming.bodies import relay_raw
from gateway.types import Receive, Scope, Send

log = logging.getLogger("gateway")

MODELS_CACHE_S = 60.0
MODELS_TIMEOUT_S = 3.0
_GLOB_CHARS = frozenset("*?[")


async def passthrough(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """Other ``/v1/*`` paths: to the first route's backend, unchanged and streamed.

    A stateful Responses path (``/v1/responses/{id}``, ``…/cancel``, ``…/input_items``) goes to
    the backend that made that response, pinned (docs/spec.md §22); an unknown id, to the first
    route's backend like any other path."""
    async with rt.request(scope, send) as req:
        ctx = req.ctx
        backend = rt.router.routes[0].backends[0]
        # with auth on, passthrough needs a key like a model call; nothing meters it, so a key
        # with a budget may use it only if it is an admin key (docs/spec.md §20)
        await rt.auth.check(ctx, passthrough=True)
        response_id = response_path_id(ctx.path)
        owner = None
        if response_id is not None:  # another tenant's response: 404 (docs/spec.md §24)
            owner = await rt.ownership.owner(response_id, ctx.tenant)
        # unchanged means unchanged: the body keeps its coding, the client picks the answer's
        for name, value in (
            ("content-encoding", ctx.content_encoding),
            ("accept-encoding", ctx.accept_encoding),
        ):
            if value is not None:
                ctx.upstream_headers.append((name, value.decode("latin-1")))
        body = stream_body(ctx, receive, rt.max_body)
        if owner is None:
            resp, attempt = await rt.upstream.forward(ctx, (backend,), body)
        else:  # tried even when ejected: the state lives only there; its error passes through
            resp, attempt = await rt.upstream.forward(ctx, (owner,), body, pinned=True)
        await relay_raw(ctx, resp, attempt, req.out)
        if response_id is not None and ctx.method == "DELETE" and resp.status == 200:
            await rt.ownership.forget(response_id)


def bad_path(why: str) -> Endpoint:
    """An endpoint that refuses a path that could leave the backend's base path (400)."""

    async def refuse(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        async with rt.request(scope, send, vary=True):
            raise InvalidRequest(f"invalid request path: {why}", code="invalid_path")

    return refuse


async def not_found(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    async with rt.request(scope, send, vary=True):
        raise NotFound(f"no such endpoint: {scope['path']}", code="unknown_path")


async def metrics(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """Prometheus text, or OpenMetrics (with trace_id exemplars) when the scraper asks."""
    exposition = rt.exposition
    if exposition is None:  # [metrics] enabled = false: no endpoint
        await not_found(rt, scope, receive, send)
        return
    accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
    body, content_type = exposition.render(accept.decode("latin-1"))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def healthz(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    await plain_json(send, 200, {"status": "ok"})


async def readyz(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    body: dict[str, Any] = {
        "status": "ready",
        "config": rt.config.source,
        # passive health per backend (docs/spec.md §13): state up | ejected | probe_due | probing;
        # never a reason to be unready (a request still tries the least recently ejected)
        "backends": _backend_states(rt),
        # reported, never a reason to be unready: requests do not depend on the collector
        "tracing": rt.tracing.state(),
        "cache": rt.cache.state(),
        # where response id -> backend lives (docs/spec.md §22): memory | redis:<state>
        "responses": rt.ownership.state(),
    }
    await plain_json(send, 200, body)


def _backend_states(rt: Runtime) -> dict[str, dict[str, Any]]:
    health = rt.health.snapshot()
    return {
        name: {"kind": "mock" if b.config.is_mock else "pooled", **health.get(name, {})}
        for name, b in rt.backends.items()
    }


class ModelCatalog:
    """``GET /v1/models``: the union of the models the routes expose (docs/spec.md §5).

    Literal names come from the routes; glob routes list their backends' own ``/models``
    (filtered by the route that would serve each), fetched with a timeout and cached.
    """

    def __init__(self) -> None:
        self._listed: dict[str, tuple[float, list[str]]] = {}

    async def __call__(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "GET":
            await passthrough(rt, scope, receive, send)
            return
        async with rt.request(scope, send, vary=True) as req:
            await rt.auth.check(req.ctx)
            permits = req.ctx.permits  # with auth on: only the models the key may call
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": o}
                for m, o in (await self._owners(rt)).items()
                if permits is None or permits(m)
            ]
            await req.out.json(200, {"object": "list", "data": data})

    async def _owners(self, rt: Runtime) -> dict[str, str]:
        owners: dict[str, str] = {}
        globbed: dict[str, list[str]] = {}
        for route in rt.router.routes:
            for pattern in route.config.models:
                if _GLOB_CHARS.isdisjoint(pattern):
                    owners.setdefault(pattern, route.backends[0].name)
                else:
                    for b in route.backends:
                        globbed.setdefault(b.name, []).append(pattern)
        listed = await asyncio.gather(*(self._backend_models(rt.backends[n]) for n in globbed))
        for name, models in zip(globbed, listed, strict=True):
            for model in models:
                # a listed model is exposed only if this route is the one that would serve it
                serving = rt.router.match(model)
                if serving is not None and any(b.name == name for b in serving.backends):
                    owners.setdefault(model, name)
        return owners

    async def _backend_models(self, backend: Backend) -> list[str]:
        cached = self._listed.get(backend.name)
        now = time.monotonic()
        if cached and now - cached[0] < MODELS_CACHE_S:
            return cached[1]
        headers = [backend.auth_header] if backend.auth_header else []
        try:
            async with asyncio.timeout(MODELS_TIMEOUT_S):
                resp = await backend.transport.request(
                    "GET", backend.url_for("/v1/models", b""), headers, None
                )
                try:
                    body = b"".join([c async for c in resp.aiter_raw()])
                finally:
                    await resp.aclose()
            ids = [m["id"] for m in orjson.loads(body)["data"] if isinstance(m.get("id"), str)]
        except (GatewayError, TimeoutError, ValueError, KeyError, TypeError, AttributeError):
            log.info(
                "backend %s: /models not reachable; its glob routes list no models", backend.name
            )
            ids = cached[1] if cached else []
        self._listed[backend.name] = (now, ids)
        return ids


async def plain_json(send: Send, status: int, obj: Any) -> None:
    """A JSON answer outside any request scope (health checks: no trace, no access log)."""
    body = orjson.dumps(obj)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
