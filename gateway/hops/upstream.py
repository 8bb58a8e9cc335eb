"""The upstream hop: a model call's attempts, backoff and fallback over pooled per-backend
transports — the attempt loop of :mod:`gateway.attempts`, with the HTTP request as its connect.

What is retried, the backoff, ``Retry-After`` and its cap, redirects and how each attempt is
settled in passive health are the loop's (docs/spec.md §13). This hop returns at the upstream's
headers, so every retry happens before any byte reaches the client; a streamed request body can
be sent once only, so it gets one attempt.

With passive health (:mod:`gateway.fleet.health`) the route's strategy orders the backends that
are in rotation for the request's model (:mod:`gateway.fleet.balance`); a retry to the backend
that just failed is sent only within that backend's retry budget (when it is spent, or the
failure ejected the backend or its pair for the model, the request goes on to the next
backend).

A pinned request (``pinned=True``: a stateful Responses call that must reach the backend
holding its state, docs/spec.md §22) goes to the first backend given and nowhere else, in
rotation or not; its error answer passes through.

On a route with ``affinity`` (docs/spec.md §21) the request's key is read here from the parsed
body (:mod:`gateway.fleet.affinity`) and the health hop orders the backends by it; each attempt
records whether it reached the key's preferred backend (``hit``), another (``spill``), or the
request had no key (``none``), and on a fleet-aware route the backend's load as last scraped —
for the attempt's span.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from typing import Any

from gateway.attempts import AttemptLoop, AttemptPlan, retry_after_seconds
from gateway.context import Attempt, RequestContext
from gateway.fleet.affinity import request_key
from gateway.fleet.health import Health, RoutePlan
from gateway.headers import header_value
from gateway.routes import Backend
from gateway.transports.base import Body, UpstreamResponse

#: extra headers per attempt (e.g. traceparent of the attempt's CLIENT span)
AttemptHeaders = Callable[[RequestContext, Attempt], list[tuple[str, str]]]
#: a context the transport call runs in (the attempt as the current OpenTelemetry span)
AttemptScope = Callable[[RequestContext, Attempt], AbstractContextManager[None]]


def _ranked(ctx: RequestContext, route: RoutePlan | None) -> Sequence[Backend] | None:
    """The route's backends in the hash order of the request's affinity key (None: the
    route has no affinity, or the request no key)."""
    if route is None or route.rendezvous is None or ctx.call is None:
        return None
    key = request_key(route.affinity, ctx.call.payload, ctx.model, ctx.scope["headers"])
    return None if key is None else route.rendezvous.rank(key)


class Upstream(AttemptLoop[Body, UpstreamResponse]):
    """Sends a request upstream; one per app, no per-request state (habit 2)."""

    def __init__(
        self,
        attempt_headers: AttemptHeaders | None = None,
        new_span_id: Callable[[], int] = lambda: 0,
        attempt_scope: AttemptScope | None = None,
        health: Health | None = None,
    ) -> None:
        super().__init__(health, new_span_id)
        #: None keeps the attempt path bare when nothing needs per-attempt headers
        self._attempt_headers = attempt_headers
        self._attempt_scope = attempt_scope

    def forward(
        self,
        ctx: RequestContext,
        backends: tuple[Backend, ...],
        body: Body,
        retries: int = 0,
        retry_on_timeout: bool = False,
        pinned: bool = False,
    ) -> Coroutine[Any, Any, tuple[UpstreamResponse, Attempt]]:
        """Awaited: the response to relay (headers in, body unread), or the last attempt's
        :class:`GatewayError` when every attempt failed. (The loop's own coroutine is returned,
        not awaited here: no second frame per request.)

        ``pinned``: ``backends[0]`` is the only backend tried, even when it (or its pair for
        the model) is ejected — no strategy, no fallback; its answer, an error too, is what
        the request gets (retries to it still need its budget, and it in rotation)."""
        order, route, ranked = self._order(ctx, backends, pinned)
        if not isinstance(body, bytes | None):
            retries = 0  # a streamed request body can be sent once only
            order = order[:1]
        plan = AttemptPlan(order, retries + 1, retry_on_timeout, route, ranked)
        return self.attempts(ctx, plan, body)

    def _order(
        self, ctx: RequestContext, backends: tuple[Backend, ...], pinned: bool
    ) -> tuple[Sequence[Backend], RoutePlan | None, Sequence[Backend] | None]:
        """The backends to try in order, the route's fleet plan and the affinity ranking."""
        if pinned:
            return backends[:1], None, None
        if self.health is None:
            return backends, None, None
        route = self.health.route(backends)
        ranked = _ranked(ctx, route)
        return self.health.order(backends, ctx.model, ranked), route, ranked

    async def connect(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt, request: Body
    ) -> UpstreamResponse:
        """The request sent; its response at the head."""
        sent = backend.transport.request(
            ctx.method,
            backend.url_for(ctx.path, ctx.query),
            self._headers(ctx, backend, attempt),
            request,
        )
        if self._attempt_scope is None:
            return await sent
        with self._attempt_scope(ctx, attempt):
            return await sent

    def retry_after(self, answer: UpstreamResponse) -> float | None:
        return retry_after_seconds(header_value(answer.headers, b"retry-after"))

    async def let_go(self, answer: UpstreamResponse, attempt: Attempt) -> None:
        await answer.aclose()

    def _headers(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt
    ) -> list[tuple[str, str]]:
        # the client's forwarded headers, the backend's key and its defaults (anthropic-version)
        headers = backend.request_headers(ctx.upstream_headers)
        if self._attempt_headers is not None:
            headers = [*headers, *self._attempt_headers(ctx, attempt)]
        return headers
