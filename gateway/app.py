"""The ASGI application: assembly only.

The lifespan builds one immutable :class:`~gateway.runtime.Runtime`; requests are dispatched by
path to an endpoint. The model call — the whole request path, hop by hop — reads top to bottom
in :func:`gateway.pipeline.model_call`::

    edge → auth → Accept-Encoding → read body → router → cache lookup
         → upstream (attempts) → relay (SSE or JSON) → cache store → telemetry
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway import endpoints, stateful
from gateway.a2a.endpoint import PREFIX as A2A
from gateway.a2a.endpoint import A2aEndpoints
from gateway.cache.service import ResponseCache
from gateway.config import Config, load_config
from gateway.live.view import LiveView
from gateway.mcp.endpoint import McpEndpoints
from gateway.pipeline import model_call
from gateway.realtime.upgrade import RealtimeEndpoint
from gateway.runtime import Endpoint, Runtime, build_runtime
from gateway.target import canonical_scope
from gateway.telemetry.tracing import Tracing
from gateway.types import Receive, Scope, Send

log = logging.getLogger("gateway")


async def _model_or_passthrough(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["method"] == "POST":
        await model_call(rt, scope, receive, send)
    else:
        await endpoints.passthrough(rt, scope, receive, send)


class Gateway:
    """The ASGI app. Per-request state lives in a request's context, never here."""

    def __init__(self, config: Config) -> None:
        self.config = config
        #: built by the lifespan's startup; None until then (and after shutdown)
        self.runtime: Runtime | None = None
        #: WebSocket handshakes: /v1/realtime sessions (docs/spec.md §19), others refused
        self._realtime = RealtimeEndpoint(config.realtime)
        self._endpoints: dict[str, Endpoint] = {
            "/v1/chat/completions": _model_or_passthrough,
            "/v1/completions": _model_or_passthrough,
            "/v1/embeddings": _model_or_passthrough,
            "/v1/responses": _model_or_passthrough,  # OpenAI Responses API
            "/v1/messages": _model_or_passthrough,  # Anthropic Messages API
            # its token count: Claude Code asks it when to compact (docs/spec.md §22)
            "/v1/messages/count_tokens": _model_or_passthrough,
            "/v1/models": endpoints.ModelCatalog(),
            "/healthz": endpoints.healthz,
            "/readyz": endpoints.readyz,
        }
        if config.metrics.enabled:
            self._endpoints["/metrics"] = endpoints.metrics
        if config.ui.enabled:  # the live view under [ui] path (docs/spec.md §18)
            self._endpoints.update(LiveView(config).endpoints())
        self._mcp = McpEndpoints(config)  # /mcp and /mcp/{server} (docs/spec.md §23)
        self._endpoints.update(self._mcp.endpoints())
        self._a2a = A2aEndpoints(config)  # /a2a and /a2a/{agent}… (docs/spec.md §30)
        self._endpoints.update(self._a2a.endpoints())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            rt = self.runtime
            path: str = scope["path"]
            if rt is None:  # not started (or stopping): only health answers
                status = 200 if path == "/healthz" else 503
                await endpoints.plain_json(send, status, {"status": "starting"})
                return
            # the path is the canonical target the server made (docs/spec.md §25): every
            # decision below and the upstream URL are made on that one spelling
            endpoint = self._endpoints.get(path)
            if endpoint is None:
                endpoint = endpoints.passthrough if path.startswith("/v1/") else endpoints.not_found
                endpoint = stateful.stateful if stateful.parse(path) else endpoint  # spec §24
                if path.startswith(A2A) and self._a2a.on:  # A2A's HTTP+JSON binding (§30)
                    endpoint = self._a2a.rest
                if not canonical_scope(scope):  # a scope made by another server: not forwarded
                    endpoint = endpoints.bad_path("the path is not in its canonical form")
            await endpoint(rt, scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await self._realtime(self.runtime, scope, receive, send)

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
        self.runtime = build_runtime(self.config)
        await self.runtime.start()

    async def shutdown(self) -> None:
        rt, self.runtime = self.runtime, None
        await self._mcp.aclose()
        await self._a2a.aclose()
        if rt is not None:
            await rt.aclose()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Startup/shutdown without an ASGI server (unit tests, embedding)."""
        await self.startup()
        try:
            yield self
        finally:
            await self.shutdown()

    # what tests and operators look at, without reaching into the runtime

    @property
    def tracing(self) -> Tracing | None:
        return self.runtime.tracing if self.runtime is not None else None

    @property
    def cache(self) -> ResponseCache | None:
        return self.runtime.cache if self.runtime is not None else None


def create_app(config: Config | None = None) -> Gateway:
    """The app for a config (default: ``$GATEWAY_CONFIG`` or the embedded default)."""
    return Gateway(config or load_config())


__all__ = ["Gateway", "create_app"]
