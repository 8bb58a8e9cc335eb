"""The endpoints other than the model call (docs/spec.md §5): models, passthrough, health,
readiness."""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson

from gateway.context import RequestContext
from gateway.errors import Forbidden, GatewayError, InvalidRequest, NotFound, UpstreamError
from gateway.headers import header_value
from gateway.hops.edge import read_body, stream_body
from gateway.hops.held import hold, listing, send_held
from gateway.hops.ownership import response_path_id
from gateway.hops.passthrough import passthrough_for
from gateway.hops.references import Named, find, id_shaped, rule_for, segments
from gateway.routes import Backend
from gateway.runtime import Endpoint, Runtime
from gateway.streaming.bodies import relay_raw, upstream_finished
from gateway.types import Receive, Scope, Send
from gateway.writer import ResponseWriter

log = logging.getLogger("gateway")

MODELS_CACHE_S = 60.0
MODELS_TIMEOUT_S = 3.0
_GLOB_CHARS = frozenset("*?[")


async def passthrough(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """Other ``/v1/*`` paths: to the first route's backend, streamed.

    A stored response's path (``/v1/responses/{id}``, ``…/cancel``, ``…/input_items``) goes to
    the backend that made that response, pinned (docs/spec.md §22). With auth off any other path
    goes unchanged, an unknown response id like any other path. With auth on the gateway fails
    closed (docs/spec.md §26): a response id it cannot place for the caller's tenant is a 404,
    and any other path needs the key's ``passthrough`` grant (:func:`_unmodelled`)."""
    async with rt.request(scope, send) as req:
        ctx = req.ctx
        # with auth on, passthrough needs a key like a model call; nothing meters it, so a key
        # with a budget may use it only if it is an admin key (docs/spec.md §20)
        await rt.auth.check(ctx, passthrough=True)
        response_id = response_path_id(ctx.path)
        if response_id in _RESPONSE_CALLS:  # /v1/responses/input_tokens: a call, not an id
            response_id = None
        owner = None
        if response_id is not None:  # another tenant's response: 404 (docs/spec.md §24)
            owner = await rt.ownership.required(response_id, ctx.tenant)
        if ctx.tenant is not None and response_id is not None:
            rest = ctx.path[len(_RESPONSES) + len(response_id) :].strip("/")
            if owner is None or rest not in _RESPONSE_RESTS:
                raise NotFound(f"no such endpoint: {ctx.path}", code="unknown_path")
            await _not_foreign(rt, ctx)
        elif ctx.tenant is not None and not _model_read(ctx):
            await _unmodelled(rt, ctx, receive, req.out)
            return
        # unchanged means unchanged: the body keeps its coding, the client picks the answer's
        for name, value in (
            ("content-encoding", ctx.content_encoding),
            ("accept-encoding", ctx.accept_encoding),
        ):
            if value is not None:
                ctx.upstream_headers.append((name, value.decode("latin-1")))
        body = stream_body(ctx, receive, rt.max_body)
        if owner is None:
            resp, attempt = await rt.upstream.forward(ctx, (_first(rt),), body)
        else:  # tried even when ejected: the state lives only there; its error passes through
            resp, attempt = await rt.upstream.forward(ctx, (owner,), body, pinned=True)
        await relay_raw(ctx, resp, attempt, req.out)
        if response_id is not None and ctx.method == "DELETE" and resp.status == 200:
            await rt.ownership.forget(response_id)


#: one model's path
_MODELS = "/v1/models/"
#: the stored responses' paths (docs/spec.md §22)
_RESPONSES = "/v1/responses/"
#: what may follow a stored response's id
_RESPONSE_RESTS = frozenset({"", "cancel", "input_items"})
#: names under /v1/responses/ that are calls of their own, not response ids
_RESPONSE_CALLS = frozenset({"input_tokens", "compact"})
#: paths of stored objects the gateway never records (stored chat completions): with auth on
#: their ids can never be placed (docs/spec.md §26)
_UNPLACEABLE = ("/v1/chat/completions/",)


def _model_read(ctx: RequestContext) -> bool:
    """``GET /v1/models/{model}`` of a model the key may call (the SDKs' ``models.retrieve``):
    as open as the catalogue, never a stored object (docs/spec.md §26)."""
    if ctx.method != "GET" or not ctx.path.startswith(_MODELS) or ctx.query:
        return False
    model = unquote(ctx.path[len(_MODELS) :])
    return bool(model) and ctx.permits is not None and ctx.permits(model)


def _first(rt: Runtime) -> Backend:
    return rt.router.routes[0].backends[0]


async def _not_foreign(rt: Runtime, ctx: RequestContext) -> None:
    """Ids in the path and the query: none another tenant's (docs/spec.md §26)."""
    for object_id in segments(ctx.path, ctx.query):
        await rt.ownership.not_foreign(object_id, ctx.tenant)


async def _unmodelled(
    rt: Runtime, ctx: RequestContext, receive: Receive, out: ResponseWriter
) -> None:
    """A path the gateway does not model, with auth on (docs/spec.md §26): only with the key's
    ``passthrough`` grant (403), never naming another tenant's object in its path, query or
    JSON body (404), and never answered with a listing of stored objects, which the gateway
    could not filter to the tenant (403)."""
    if ctx.path.startswith(_UNPLACEABLE):
        raise NotFound(f"no such endpoint: {ctx.path}", code="unknown_path")
    if not passthrough_for(rt.config.auth).allows_key(ctx.limit_key, ctx.path):
        raise Forbidden(
            f"this API key may not reach {ctx.path}: the gateway does not model it; list it "
            "in the key's `passthrough` globs to forward it (docs/spec.md §26)",
            code="passthrough_not_allowed",
        )
    await _not_foreign(rt, ctx)
    body = await _checked_body(rt, ctx, receive)
    ctx.upstream_headers.append(("accept-encoding", "identity"))  # an answer read to check it
    resp, attempt = await rt.upstream.forward(ctx, (_first(rt),), body)
    kind = header_value(resp.headers, b"content-type") or b""
    if not (200 <= resp.status < 300 and b"json" in kind):
        await relay_raw(ctx, resp, attempt, out)
        return
    held, _ = await hold(ctx, resp, attempt)
    if held is None or (held.obj is None and held.body.strip()):  # not one readable object
        if held is None:
            upstream_finished(ctx, attempt, resp)
            await resp.aclose()
        raise UpstreamError(
            "the answer could not be read to check it (too long, or encoded): not relayed "
            "(docs/spec.md §26)",
            code="answer_unchecked",
        )
    if listing(held.obj):
        raise Forbidden(
            f"{ctx.path} answers a list of stored objects the gateway cannot filter to your "
            "tenant: not relayed (docs/spec.md §26)",
            code="unfiltered_listing",
        )
    await send_held(out, held, resp)


async def _checked_body(rt: Runtime, ctx: RequestContext, receive: Receive) -> bytes | None:
    """An unmodelled call's body, read whole (bounded): a JSON one must name no object of
    another tenant — at the table's places none the tenant does not own — and goes on as it
    was parsed (what was checked is what the upstream reads); a form's values are checked the
    same way; another (a multipart upload, a binary) goes on as it came, on the strength of the
    key's grant."""
    raw = await read_body(ctx, receive, rt.max_body)  # decoded: sent on without its coding
    if not raw:
        return None
    kind = (header_value(ctx.scope["headers"], b"content-type") or b"").lower()
    text = raw.lstrip(b" \t\r\n").removeprefix(codecs.BOM_UTF8)  # a reader may skip a BOM
    if b"json" in kind or text[:1] in (b"{", b"["):
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(
                f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from exc
        rule = rule_for(ctx.path)
        named = (find(rule, None, payload) if rule is not None else None) or Named()
        named.loose.extend(id_shaped(payload))
        await rt.ownership.place(named, ctx.tenant)
        return orjson.dumps(payload)
    if b"x-www-form-urlencoded" in kind:
        named = Named()
        named.loose.extend(id_shaped(parse_qs(raw.decode("latin-1"))))
        await rt.ownership.place(named, ctx.tenant)
    return raw


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


async def starting(scope: Scope, send: Send) -> None:
    """Before the app is up (and while it stops): ``/healthz`` is 200, every other path 503."""
    status = 200 if scope["path"] == "/healthz" else 503
    await plain_json(send, status, {"status": "starting"})


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
    sign_ins = rt.auth.sign_ins
    if sign_ins is not None:  # each issuer's JWK Set (docs/spec.md §29): never a reason either
        body["sign_in"] = {ks.url: ks.state() for ks in sign_ins.key_sets()}
    keys = rt.services.keys if rt.services is not None else None
    if keys is not None:  # docs/spec.md §28: the known keys are still served, so still ready
        body["key_store"] = {"store": keys.name, "state": keys.state()}
        if keys.failure is not None:
            body["status"] = "degraded"
            body["degraded"] = ["key_store"]
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
