"""Build the gateway: the lifespan (pooled clients, ...) and the hop stack.

The whole request path of a model call reads top to bottom in :meth:`Gateway.model_call`:

    edge → read body → auth → router → upstream → relay (SSE or JSON) → telemetry

Each hop is a module under ``gateway/hops``; they share one typed per-request context
(:mod:`gateway.context`) and data only moves forward.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson

from gateway.cache.flight import CONTENT, Flight
from gateway.cache.replay import DONE_EVENT, Entry, replay_events, usage_event
from gateway.cache.service import CachePlan, ResponseCache, StreamTee, json_entry, make_store
from gateway.config import Config, load_config
from gateway.context import RequestContext
from gateway.encoding import negotiate
from gateway.errors import (
    GatewayError,
    NotAcceptable,
    NotFound,
    PayloadTooLarge,
    UpstreamStreamError,
)
from gateway.hops import upstream
from gateway.hops.auth import Auth
from gateway.hops.edge import ClientGone, Edge, read_body
from gateway.hops.router import OPERATIONS, Router
from gateway.hops.upstream import Backend
from gateway.streaming import VARY, Relay
from gateway.telemetry.logs import AccessLog
from gateway.telemetry.server_timing import edge_intervals, server_timing
from gateway.telemetry.tracing import Tracing
from gateway.types import Message, RawHeaders, Receive, Scope, Send

log = logging.getLogger("gateway")

MODELS_CACHE_S = 60.0
MODELS_TIMEOUT_S = 3.0
_GLOB_CHARS = frozenset("*?[")


class ResponseAborted(Exception):
    """The upstream failed after the response started: the client connection is dropped so a
    partial body can never be mistaken for a complete one."""


class Gateway:
    """The ASGI application. Per-request state lives in a :class:`RequestContext`, never here."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.edge = Edge(config.edge)
        self.auth = Auth()
        self.relay = Relay(self._headers_at_start)
        self.tracing: Tracing | None = None  # made in startup (it starts the export thread)
        #: per-attempt headers (traceparent) when tracing; None keeps the attempt path bare
        self._extra_headers: upstream.AttemptHeaders | None = None
        self.access_log = AccessLog(config.logging)
        #: the store connects lazily: a dead Redis never stops the gateway from starting
        self.cache = ResponseCache(config.cache, make_store(config.cache))
        self.max_body = config.server.max_body_bytes
        self.backends: dict[str, Backend] = {}
        self.router: Router | None = None
        self.ready = False
        self._models_cache: dict[str, tuple[float, list[str]]] = {}
        self._paths = {
            "/v1/chat/completions": self.model_call,
            "/v1/completions": self.model_call,
            "/v1/embeddings": self.model_call,
            "/v1/models": self.list_models,
            "/healthz": self.healthz,
            "/readyz": self.readyz,
        }

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            handler = self._paths.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
            elif scope["path"].startswith("/v1/"):
                await self.passthrough(scope, receive, send)
            else:
                await self.not_found(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets are not part of the OpenAI HTTP surface: uvicorn closes them

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        logging.getLogger("gateway").setLevel(self.config.logging.level.upper())
        self.tracing = Tracing(
            self.config.tracing,
            edge_hop_count=len(self.config.edge.hops),
            cache_backend=self.config.cache.backend,
        )
        if self.tracing.enabled:
            self._extra_headers = self._attempt_headers
        for cfg in self.config.backends:
            if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
                log.warning(
                    "backend %s: env var %s is not set; no key is sent upstream",
                    cfg.name,
                    cfg.api_key_env,
                )
            self.backends[cfg.name] = Backend(cfg)
        self.router = Router(self.config.routes, self.backends)
        self.ready = True

    async def shutdown(self) -> None:
        self.ready = False
        await asyncio.gather(
            *(b.transport.aclose() for b in self.backends.values()), return_exceptions=True
        )
        await self.cache.aclose()
        if self.tracing is not None:
            # the export thread may wait on a dead collector: keep the loop free meanwhile
            await asyncio.to_thread(self.tracing.shutdown)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Startup/shutdown without an ASGI server (unit tests, embedding)."""
        await self.startup()
        try:
            yield self
        finally:
            await self.shutdown()

    # ------------------------------------------------------------ the hot path

    async def model_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await self.passthrough(scope, receive, send)
            return
        ctx = self.begin(scope, vary=True)  # edge: trust, X-Forwarded-*, request id, trace ids
        try:
            self.auth.check(ctx)  # key -> tenant, before reading any body
            ctx.coding = _negotiate(ctx)  # Accept-Encoding: br | zstd | gzip | identity, or 406
            ctx.body = await read_body(ctx, receive, self.max_body)  # bounded, decoded: 413/415
            ctx.timeline.body_received = time.perf_counter()
            assert self.router is not None
            self.router.route(ctx)  # parse once, route, policies
            lookup = await self.cache.lookup(ctx)  # hit, an identical request in flight, or miss
            ctx.timeline.routed = time.perf_counter()
            if lookup.entry is not None:
                await self.replay(ctx, lookup.entry, send, receive)
            elif lookup.follow is not None:
                await self.follow(ctx, lookup.follow, send, receive)
            else:
                await self.call_upstream(ctx, lookup.plan, send, receive)
        except GatewayError as exc:
            await self._fail(ctx, exc, send)
        except ClientGone:
            ctx.status = 499
        finally:
            self.finish(ctx)  # spans, access log: from the Timeline

    async def call_upstream(
        self, ctx: RequestContext, plan: CachePlan | None, send: Send, receive: Receive
    ) -> None:
        """Upstream attempts, then the relay (SSE event by event, or JSON held until complete);
        a complete valid answer goes into the cache (``plan``) after the response."""
        route = ctx.route
        assert route is not None
        # SPEC §9: ask for compressed JSON (decoded here as needed); streams ask for identity,
        # since an upstream that compresses SSE without a flush per event would hold events back
        ctx.upstream_headers.append(_UPSTREAM_STREAM_CODING if ctx.stream else _UPSTREAM_CODING)
        entry: Entry | None = None
        cut: UpstreamStreamError | None = None
        try:
            resp, attempt = await upstream.forward(  # attempts, backoff, fallback
                ctx,
                route.backends,
                route.config.retries,
                route.config.retry_on_timeout,
                ctx.body,
                self._extra_headers,
                self._new_span_id,
            )
            if ctx.stream and resp.status == 200:
                idle = attempt.backend.config.stream_idle_timeout_s
                tee = StreamTee(plan) if plan is not None else None
                cut = await self.relay.relay_sse(
                    ctx, resp, attempt, send, receive, idle, ctx.coding, tee
                )
                if (
                    plan is not None
                    and plan.collector is not None
                    and cut is None
                    and not ctx.disconnected
                ):
                    entry = plan.collector.entry(time.time())
            else:
                body = await self.relay.relay_json(ctx, resp, attempt, send, ctx.coding)
                if plan is not None and body is not None and resp.status == 200:
                    entry = json_entry(ctx, body)
        finally:
            if plan is not None:
                error_event = cut.sse_event() if cut is not None else None
                await self.cache.complete(ctx, plan, entry, error_event)

    async def replay(self, ctx: RequestContext, entry: Entry, send: Send, receive: Receive) -> None:
        """A cached answer, in the form this request asked for (SPEC §10)."""
        if ctx.stream and entry.operation != "embeddings":
            events = replay_events(entry, _wants_usage(ctx))
            await self.relay.replay_sse(ctx, events, send, receive, ctx.coding)
        else:
            await self.relay.replay_json(ctx, entry.body, send, ctx.coding)
        ctx.input_tokens, ctx.output_tokens = entry.tokens

    async def follow(
        self, ctx: RequestContext, flight: Flight, send: Send, receive: Receive
    ) -> None:
        """An identical request is in flight in this process: share its answer."""
        if ctx.stream and flight.streaming:
            first = await _first_event_or_end(flight)
            if first:  # the leader is streaming: tail it live
                self.cache.followed(ctx, None)
                events = _tail_events(flight, _wants_usage(ctx))
                await self.relay.replay_sse(ctx, events, send, receive, ctx.coding)
                if flight.entry is None:
                    ctx.error = UpstreamStreamError(
                        "the upstream stream this answer was shared with was cut"
                    )
                return
        else:
            entry = await flight.wait()
            if entry is not None:
                self.cache.followed(ctx, entry)
                await self.replay(ctx, entry, send, receive)
                return
        # the leader produced nothing to share: ask the upstream ourselves (and store)
        await self.call_upstream(ctx, self.cache.plan_for_follower(ctx), send, receive)

    def begin(self, scope: Scope, vary: bool = False) -> RequestContext:
        ctx = self.edge.accept(scope)
        ctx.response_headers.append((b"x-request-id", ctx.request_id.encode()))
        if vary:  # answers the gateway encodes itself vary by Accept-Encoding (SPEC §9)
            ctx.response_headers.append(VARY)
        tracing = self.tracing
        if tracing is not None and tracing.enabled:
            tracing.begin(ctx, ctx.incoming_trace)
            if tracing.capture_content:
                ctx.captured = []
        elif ctx.incoming_trace is not None:
            # not tracing: stay transparent to the client's own trace context
            tp, ts = ctx.incoming_trace
            ctx.upstream_headers.append(("traceparent", tp.decode("latin-1")))
            if ts:
                ctx.upstream_headers.append(("tracestate", ts.decode("latin-1")))
        return ctx

    def _attempt_headers(self, ctx: RequestContext, attempt: Any) -> list[tuple[str, str]]:
        assert self.tracing is not None and ctx.trace is not None
        return self.tracing.attempt_headers(ctx, attempt)

    def _new_span_id(self) -> int:
        return self.tracing.new_span_id() if self.tracing is not None else 0

    def _headers_at_start(self, ctx: RequestContext) -> RawHeaders:
        """Headers derived from the Timeline as the response starts (SPEC §6)."""
        headers: RawHeaders = [(b"server-timing", server_timing(ctx, edge_intervals(ctx)))]
        if self.tracing is not None:
            tr = self.tracing.traceresponse(ctx)
            if tr is not None:
                headers.append(tr)
        return headers

    async def _fail(self, ctx: RequestContext, exc: GatewayError, send: Send) -> None:
        ctx.error = exc
        if not ctx.response_started:
            await self.relay.error(ctx, exc, send)
            return
        log.warning(
            "request %s: upstream failed after the response started: %s",
            ctx.request_id,
            exc.message,
        )
        raise ResponseAborted(exc.message) from exc

    def finish(self, ctx: RequestContext) -> None:
        t = ctx.timeline
        if t.done is None:
            t.done = time.perf_counter()
        if ctx.disconnected and ctx.status < 400:
            ctx.status = 499
        if self.tracing is not None:
            self.tracing.finish(ctx, edge_intervals(ctx))
        self.access_log.record(ctx)

    # ------------------------------------------------------------ other endpoints

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Other ``/v1/*`` paths: to the first route's backend, unchanged and streamed."""
        ctx = self.begin(scope)
        try:
            assert self.router is not None
            backend = self.router.routes[0].backends[0]
            self.auth.check(ctx)
            # unchanged means unchanged: the body keeps its coding, the client picks the answer's
            for name, value in (
                (b"content-encoding", ctx.content_encoding),
                (b"accept-encoding", ctx.accept_encoding),
            ):
                if value is not None:
                    ctx.upstream_headers.append((name.decode(), value.decode("latin-1")))
            body = _streamed_body(ctx, receive, self.max_body)
            resp, attempt = await upstream.forward(
                ctx, (backend,), 0, False, body, self._extra_headers, self._new_span_id
            )
            await self.relay.relay_raw(ctx, resp, attempt, send)
        except GatewayError as exc:
            await self._fail(ctx, exc, send)
        except ClientGone:
            ctx.status = 499
        finally:
            self.finish(ctx)

    async def list_models(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "GET":
            await self.passthrough(scope, receive, send)
            return
        ctx = self.begin(scope, vary=True)
        assert self.router is not None
        owners: dict[str, str] = {}
        globbed: dict[str, list[str]] = {}
        for route in self.router.routes:
            for pattern in route.config.models:
                if _GLOB_CHARS.isdisjoint(pattern):
                    owners.setdefault(pattern, route.backends[0].name)
                else:
                    for b in route.backends:
                        globbed.setdefault(b.name, []).append(pattern)
        listed = await asyncio.gather(*(self._backend_models(self.backends[n]) for n in globbed))
        for name, models in zip(globbed, listed, strict=True):
            for model in models:
                # a listed model is exposed only if this route is the one that would serve it
                serving = self.router.match(model)
                if serving is not None and any(b.name == name for b in serving.backends):
                    owners.setdefault(model, name)
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": o} for m, o in owners.items()
        ]
        await self._json(ctx, send, 200, {"object": "list", "data": data})
        self.finish(ctx)

    async def _backend_models(self, backend: Backend) -> list[str]:
        cached = self._models_cache.get(backend.name)
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
        self._models_cache[backend.name] = (now, ids)
        return ids

    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _plain_json(send, 200, {"status": "ok"})

    async def readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        body: dict[str, Any] = {
            "status": "ready" if self.ready else "starting",
            "config": self.config.source,
            "backends": {
                n: "mock" if b.config.is_mock else "pooled" for n, b in self.backends.items()
            },
            # reported, never a reason to be unready: requests do not depend on the collector
            "tracing": self.tracing.state() if self.tracing is not None else {"exporter": "none"},
            "cache": self.cache.state(),
        }
        await _plain_json(send, 200 if self.ready else 503, body)

    async def not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = self.begin(scope, vary=True)
        await self.relay.error(
            ctx, NotFound(f"no such endpoint: {scope['path']}", code="unknown_path"), send
        )
        self.finish(ctx)

    async def _json(self, ctx: RequestContext, send: Send, status: int, obj: Any) -> None:
        body = orjson.dumps(obj)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await self.relay.start(ctx, send, status, headers)
        await send({"type": "http.response.body", "body": body})


_UPSTREAM_CODING = ("accept-encoding", "br, zstd, gzip")
_UPSTREAM_STREAM_CODING = ("accept-encoding", "identity")


def _negotiate(ctx: RequestContext) -> str:
    coding = negotiate(ctx.accept_encoding)
    if coding is None:
        raise NotAcceptable(
            "no acceptable Content-Encoding: the gateway answers in br, zstd, gzip or identity",
            code="no_acceptable_encoding",
        )
    return coding


def _wants_usage(ctx: RequestContext) -> bool:
    opts = (ctx.payload or {}).get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


async def _first_event_or_end(flight: Flight) -> bool:
    """Wait until the leader publishes an event (True) or finishes without any (False)."""
    while not flight.events and not flight.finished:
        await flight.changed()
    return bool(flight.events)


async def _tail_events(flight: Flight, include_usage: bool) -> AsyncIterator[bytes]:
    """A follower's copy of the leader's live stream, with its own usage/[DONE] ending."""
    async for kind, raw in flight.tail():
        if kind == CONTENT:
            yield raw
    if flight.entry is not None:
        if include_usage:
            usage = usage_event(flight.entry)
            if usage is not None:
                yield usage
        yield DONE_EVENT
    elif flight.error_event is not None:
        yield flight.error_event
    else:
        yield UpstreamStreamError(
            "the upstream stream this answer was shared with was cut"
        ).sse_event()


def _streamed_body(
    ctx: RequestContext, receive: Receive, limit: int
) -> AsyncIterator[bytes] | None:
    """The request body as an async iterator for passthrough (None when there is none)."""
    has_body = False
    for name, value in ctx.scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise PayloadTooLarge(
                    f"request body exceeds the limit of {limit} bytes", code="body_too_large"
                )
            has_body = value != b"0"
        elif name == b"transfer-encoding":
            has_body = True
    if not has_body:
        return None

    async def chunks() -> AsyncIterator[bytes]:
        size = 0
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                ctx.disconnected = True
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return

    return chunks()


async def _plain_json(send: Send, status: int, obj: Any) -> None:
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


def create_app(config: Config | None = None) -> Gateway:
    """The app for a config (default: ``$GATEWAY_CONFIG`` or the embedded default)."""
    return Gateway(config or load_config())


__all__ = ["OPERATIONS", "Gateway", "create_app"]
