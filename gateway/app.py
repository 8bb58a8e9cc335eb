"""The ASGI application: assembly only.

The lifespan builds one immutable :class:`~gateway.runtime.Runtime` (a reload swaps it:
:mod:`gateway.snapshots`); requests are dispatched by path to an endpoint. The model call — the
whole request path, hop by hop — reads top to bottom in :func:`gateway.pipeline.model_call`::

    edge → auth → Accept-Encoding → read body → router → cache lookup
         → upstream (attempts) → relay (SSE or JSON) → cache store → telemetry
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway import endpoints
from gateway.a2a.endpoint import A2aEndpoints
from gateway.cache.service import ResponseCache
from gateway.config import Config, load_config
from gateway.live.view import LiveView
from gateway.mcp.endpoint import McpEndpoints
from gateway.pipeline import model_call
from gateway.realtime.upgrade import RealtimeEndpoint
from gateway.runtime import Endpoint, Runtime
from gateway.snapshots import Snapshots
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
        #: the runtime snapshots: built by the lifespan's startup, swapped by a reload
        self.snapshots = Snapshots(self._serve)
        self.admin_listener = self.snapshots.listener  # [admin] listen's ASGI app (spec §28)
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
        self._view = LiveView(config) if config.ui.enabled else None  # docs/spec.md §18
        self._endpoints.update(self._view.endpoints() if self._view is not None else {})
        self._mcp = McpEndpoints(config)  # /mcp and /mcp/{server} (docs/spec.md §23)
        self._a2a = A2aEndpoints(config)  # /a2a and /a2a/{agent}… (docs/spec.md §30)

    def _serve(self, config: Config) -> dict[str, Endpoint]:
        """A config the app starts to serve: its dispatch table, the live view's keys."""
        self.config = config
        if self._view is not None:
            self._view.sessions.use_keys(config.auth.keys)
        return {**self._endpoints, **self._mcp.endpoints(config), **self._a2a.endpoints(config)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        gen = self.snapshots.current
        if gen is None:  # not started (or stopping): only health answers
            if kind == "websocket":
                return await self._realtime(None, scope, receive, send)
            return await endpoints.starting(scope, send)
        endpoint = gen.endpoint(scope) if kind == "http" else self._realtime
        gen.active += 1  # the request ends on the snapshot it began with (docs/spec.md §29)
        try:
            await endpoint(gen.runtime, scope, receive, send)
        finally:
            gen.active -= 1
            if gen.retired and not gen.active:
                self.snapshots.idle(gen)

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
        await self.snapshots.start(self.config)

    async def reload(self, config: Config | None = None) -> bool:
        """Serve the config file as it is now (docs/spec.md §29); False: the old one is kept."""
        return await self.snapshots.reload(config) is not None

    async def shutdown(self) -> None:
        await self.snapshots.aclose()
        await self._mcp.aclose()
        await self._a2a.aclose()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Startup/shutdown without an ASGI server (unit tests, embedding)."""
        await self.startup()
        try:
            yield self
        finally:
            await self.shutdown()

    @property
    def runtime(self) -> Runtime | None:  # the snapshot serving now
        return gen.runtime if (gen := self.snapshots.current) is not None else None

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
