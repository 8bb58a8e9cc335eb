"""The request scope: begin → error rendering → 499 → finish, once, for every endpoint.

::

    async with rt.request(scope, send) as req:   # the edge hop: context, request id, trace ids
        ...                                       # hops; answer through req.out
    # GatewayError before the response started -> rendered in the OpenAI shape (docs/spec.md §5)
    # GatewayError after it started            -> the connection is dropped (ResponseAborted)
    # ClientGone                                -> status 499
    # always                                    -> done stamped, telemetry from the Timeline
"""

from __future__ import annotations

import logging
import time
from types import TracebackType

from gateway.context import RequestContext
from gateway.errors import ClientGone, GatewayError
from gateway.headers import VARY
from gateway.hops.edge import RequestEdge
from gateway.telemetry import Telemetry
from gateway.types import Scope, Send
from gateway.writer import ResponseWriter

log = logging.getLogger("gateway")


class ResponseAborted(Exception):
    """The upstream failed after the response started: the client connection is dropped so a
    partial body can never be mistaken for a complete one."""


class InternalError(GatewayError):
    """A bug: rendered as a 500 in the OpenAI shape instead of a bare traceback."""


class RequestScope:
    __slots__ = ("_telemetry", "ctx", "out")

    def __init__(
        self, edge: RequestEdge, telemetry: Telemetry, scope: Scope, send: Send, vary: bool
    ) -> None:
        ctx = edge.accept(scope)  # trust, X-Forwarded-*, request id, edge timing headers
        ctx.response_headers.append((b"x-request-id", ctx.request_id.encode()))
        if vary:  # answers the gateway encodes itself vary by Accept-Encoding (docs/spec.md §9)
            ctx.response_headers.append(VARY)
        telemetry.begin(ctx)
        self._telemetry = telemetry
        self.ctx: RequestContext = ctx
        self.out = ResponseWriter(ctx, send, telemetry.headers_at_start)

    async def __aenter__(self) -> RequestScope:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            if exc is None:
                return False
            if isinstance(exc, GatewayError):
                await self._failed(exc)
                return True
            if isinstance(exc, ClientGone):
                self.ctx.disconnected = True
                return True
            if isinstance(exc, Exception) and not isinstance(exc, ResponseAborted):
                log.error("request %s failed", self.ctx.request_id, exc_info=exc)
                await self._failed(InternalError("internal error in the gateway"))
                return True
            return False
        finally:
            self._finish()

    async def _failed(self, exc: GatewayError) -> None:
        self.ctx.answer.error = exc
        if not self.out.started:
            await self.out.error(exc)
            return
        log.warning(
            "request %s: upstream failed after the response started: %s",
            self.ctx.request_id,
            exc.message,
        )
        raise ResponseAborted(exc.message) from exc

    def _finish(self) -> None:
        ctx = self.ctx
        if ctx.timeline.done is None:
            ctx.timeline.done = time.perf_counter()
        if ctx.disconnected and ctx.answer.status < 400:
            ctx.answer.status = 499
        self._telemetry.finish(ctx)
