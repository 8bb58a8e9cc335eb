"""The upstream hop: attempts, backoff and fallback over pooled per-backend transports.

Retries follow docs/spec.md §13: every LLM call is a non-idempotent POST (RFC 9110 §9.2.2), so
a request is sent again only when no completion can have been produced — connect failures, and
429/502/503/504 answers — unless the route sets ``retry_on_timeout``. Retries happen before any
byte reaches the client (this hop returns at the upstream's headers). Exponential backoff with
full jitter from 100 ms; ``Retry-After`` is honoured up to :data:`RETRY_AFTER_CAP` s, beyond
that the backend is given up for this request and the next one (fallback) is tried. The time
actually spent asleep between attempts is the request's ``backoff`` (docs/spec.md §6): neither
the upstream's time nor the gateway's own.

With passive health (:mod:`gateway.hops.health`) the route's strategy orders the backends that
are in rotation for the request's model (:mod:`gateway.hops.balance`); every attempt's outcome
is settled there — here when the attempt ends before its answer is relayed or answers a
retryable status (before the retry is decided), at the request's end otherwise — and a retry to
the backend that just failed is sent only within that backend's retry budget (when it is spent,
or the failure ejected the backend or its pair for the model, the request goes on to the next
backend).

A pinned request (``pinned=True``: a stateful Responses call that must reach the backend
holding its state, docs/spec.md §22) goes to the first backend given and nowhere else, in
rotation or not; its error answer passes through.

On a route with ``affinity`` (docs/spec.md §21) the request's key is read here from the parsed
body (:mod:`gateway.hops.affinity`) and the health hop orders the backends by it; each attempt
records whether it reached the key's preferred backend (``hit``), another (``spill``), or the
request had no key (``none``), and on a fleet-aware route the backend's load as last scraped —
for the attempt's span.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Generic, TypeVar

from gateway.context import Attempt, RequestContext
from gateway.errors import GatewayError, UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.fleet.affinity import request_key
from gateway.fleet.health import CONNECTION_FAILED, SUCCESS, Health, RoutePlan, answer_outcome
from gateway.headers import header_value
from gateway.routes import Backend
from gateway.transports.base import Body, UpstreamResponse

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 2.0
RETRY_AFTER_CAP = 2.0

_B = TypeVar("_B")

#: extra headers per attempt (e.g. traceparent of the attempt's CLIENT span)
AttemptHeaders = Callable[[RequestContext, Attempt], list[tuple[str, str]]]
#: a context the transport call runs in (the attempt as the current OpenTelemetry span)
AttemptScope = Callable[[RequestContext, Attempt], AbstractContextManager[None]]


class AttemptPlan(Generic[_B]):
    """Which backend each attempt goes to: every backend in order, ``tries`` times each.

    >>> plan = AttemptPlan(("a", "b"), tries=2)
    >>> [plan.next() for _ in range(5)]
    ['a', 'a', 'b', 'b', None]
    """

    __slots__ = ("_backend", "_backends", "_tried", "_tries", "number")

    def __init__(self, backends: Sequence[_B], tries: int) -> None:
        self._backends = backends
        self._tries = tries
        self._backend = 0
        self._tried = 0
        #: 1-based number of the attempt last handed out
        self.number = 0

    def next(self) -> _B | None:
        if self._tried >= self._tries:
            self._backend += 1
            self._tried = 0
        if self._backend >= len(self._backends):
            return None
        self._tried += 1
        self.number += 1
        return self._backends[self._backend]

    @property
    def more(self) -> bool:
        """Whether another attempt would follow the current one."""
        return self._tried < self._tries or self._backend + 1 < len(self._backends)

    @property
    def is_retry(self) -> bool:
        """Whether the attempt last handed out repeats the backend of the one before."""
        return self._tried > 1

    @property
    def next_is_retry(self) -> bool:
        """Whether the next attempt would go to the same backend again."""
        return self._tried < self._tries

    @property
    def on_last_backend(self) -> bool:
        return self._backend == len(self._backends) - 1

    def skip_backend(self) -> None:
        """The next attempt goes to the next backend (fallback)."""
        self._tried = self._tries


def _retry_allowed(exc: GatewayError, retry_on_timeout: bool) -> bool:
    if isinstance(exc, UpstreamConnectError):
        return True
    if isinstance(exc, UpstreamError | UpstreamTimeout):
        return not exc.request_sent or retry_on_timeout
    return False


def _retry_after(resp: UpstreamResponse) -> float | None:
    raw = header_value(resp.headers, b"retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP-date: treat like no hint (backoff applies)


def _backoff(retry_number: int) -> float:
    return random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (retry_number - 1)))


def _ranked(ctx: RequestContext, route: RoutePlan | None) -> Sequence[Backend] | None:
    """The route's backends in the hash order of the request's affinity key (None: the
    route has no affinity, or the request no key)."""
    if route is None or route.rendezvous is None or ctx.call is None:
        return None
    key = request_key(route.affinity, ctx.call.payload, ctx.model, ctx.scope["headers"])
    return None if key is None else route.rendezvous.rank(key)


def _is_redirect(status: int) -> bool:
    return 300 <= status < 400 and status != 304


class Upstream:
    """Sends a request upstream; one per app, no per-request state (habit 2)."""

    def __init__(
        self,
        attempt_headers: AttemptHeaders | None = None,
        new_span_id: Callable[[], int] = lambda: 0,
        attempt_scope: AttemptScope | None = None,
        health: Health | None = None,
    ) -> None:
        #: None keeps the attempt path bare when nothing needs per-attempt headers
        self._attempt_headers = attempt_headers
        self._new_span_id = new_span_id
        self._attempt_scope = attempt_scope
        #: passive health, retry budget and strategies (None: configured order, no budget)
        self.health = health

    async def forward(
        self,
        ctx: RequestContext,
        backends: tuple[Backend, ...],
        body: Body,
        retries: int = 0,
        retry_on_timeout: bool = False,
        pinned: bool = False,
    ) -> tuple[UpstreamResponse, Attempt]:
        """Return the response to relay (headers in, body unread), or raise the last
        attempt's :class:`GatewayError` when every attempt failed.

        ``pinned``: ``backends[0]`` is the only backend tried, even when it (or its pair for
        the model) is ejected — no strategy, no fallback; its answer, an error too, is what
        the request gets (retries to it still need its budget, and it in rotation)."""
        order, route, ranked = self._order(ctx, backends, pinned)
        if not isinstance(body, bytes | None):
            retries = 0  # a streamed request body can be sent once only
            order = order[:1]
        plan = AttemptPlan(order, retries + 1)
        delay = 0.0
        while (backend := plan.next()) is not None:
            if delay:
                await self._wait(ctx, delay)
            attempt = self._begin(ctx, backend, plan)
            if route is not None and route.fleet:  # what the span tells of the choice
                self._routed(attempt, route, ranked)
            try:
                resp = await self._send(ctx, backend, attempt, body)
            except GatewayError as exc:
                attempt.finished()
                attempt.error = exc
                self._settle(attempt, CONNECTION_FAILED, None)
                if _retry_allowed(exc, retry_on_timeout) and self._another(ctx, plan, backend):
                    delay = _backoff(plan.number)
                    continue
                raise
            attempt.first_byte = time.perf_counter()
            attempt.status = status = resp.status
            if _is_redirect(status):
                self._settle(attempt, SUCCESS, ctx.model)  # it answered; config sent us astray
                await self._refuse_redirect(resp, attempt)
            if status in RETRYABLE_STATUS:
                # settled before the retry is decided, as a failure that raised is: when this
                # 503 is the one that ejects the backend (or the pair), it is not retried there
                # (a retry would be a trial whose success restores it at once); when the answer
                # is relayed instead, it was settled here with the outcome the request's end
                # gives
                self._settle(attempt, answer_outcome(status, ctx.model), ctx.model)
                next_delay = self._retry_delay(ctx, resp, backend, plan)
                if next_delay is not None:
                    await resp.aclose()
                    attempt.finished()
                    delay = next_delay
                    continue
            return resp, attempt  # settled when the request ends (health.finished)
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

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

    @staticmethod
    async def _wait(ctx: RequestContext, delay: float) -> None:
        """Sleep between attempts; the time actually asleep (a cancelled wait too) is the
        request's backoff (docs/spec.md §6)."""
        asleep = time.perf_counter()
        try:
            await asyncio.sleep(delay)
        finally:
            ctx.timeline.backoff += time.perf_counter() - asleep

    def _another(self, ctx: RequestContext, plan: AttemptPlan[Backend], backend: Backend) -> bool:
        """Whether another attempt follows a retryable failure on ``backend``: a retry to it
        needs its budget (and it, and its pair for the model, still in rotation), else the
        next backend is tried."""
        if (
            self.health is not None
            and plan.next_is_retry
            and not self.health.may_retry(backend, ctx.model)
        ):
            plan.skip_backend()
        return plan.more

    def _retry_delay(
        self,
        ctx: RequestContext,
        resp: UpstreamResponse,
        backend: Backend,
        plan: AttemptPlan[Backend],
    ) -> float | None:
        """After a 429/502/503/504: the delay before the next attempt, or None to relay it."""
        hint = _retry_after(resp)
        if hint is not None and hint > RETRY_AFTER_CAP:
            # more patience asked than we have: the next backend, or this answer on the last
            if plan.on_last_backend:
                return None
            plan.skip_backend()
            return 0.0
        if not self._another(ctx, plan, backend):
            return None
        return hint if hint is not None else _backoff(plan.number)

    def _settle(self, attempt: Attempt, outcome: int, model: str | None) -> None:
        if self.health is not None:
            self.health.settle(attempt, outcome, model)

    async def _send(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt, body: Body
    ) -> UpstreamResponse:
        request = backend.transport.request(
            ctx.method,
            backend.url_for(ctx.path, ctx.query),
            self._headers(ctx, backend, attempt),
            body,
        )
        if self._attempt_scope is None:
            return await request
        with self._attempt_scope(ctx, attempt):
            return await request

    def _begin(self, ctx: RequestContext, backend: Backend, plan: AttemptPlan[Backend]) -> Attempt:
        attempt = Attempt(backend, plan.number, self._new_span_id())
        ctx.attempts.append(attempt)
        if ctx.timeline.upstream_sent is None:
            ctx.timeline.upstream_sent = attempt.start
        if self.health is not None:
            self.health.begin(attempt, plan.is_retry, ctx.model)
        return attempt

    def _routed(self, attempt: Attempt, route: RoutePlan, ranked: Sequence[Backend] | None) -> None:
        """What the attempt's span tells of the choice: affinity, the backend's load."""
        if route.rendezvous is not None:
            if ranked is None:
                attempt.affinity = "none"
            else:
                attempt.affinity = "hit" if attempt.backend is ranked[0] else "spill"
        if route.watched:
            assert self.health is not None
            load = self.health.load(attempt.backend)
            if load is not None:
                attempt.load = (load.queue, load.kv_cache)

    def _headers(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt
    ) -> list[tuple[str, str]]:
        # the client's forwarded headers, the backend's key and its defaults (anthropic-version)
        headers = backend.request_headers(ctx.upstream_headers)
        if self._attempt_headers is not None:
            headers = [*headers, *self._attempt_headers(ctx, attempt)]
        return headers

    @staticmethod
    async def _refuse_redirect(resp: UpstreamResponse, attempt: Attempt) -> None:
        # docs/spec.md §13: never followed, never passed on — a key is never sent, and a client
        # never sent, to a host that config did not name
        await resp.aclose()
        attempt.finished()
        attempt.error = UpstreamError(
            f"upstream answered {resp.status} (a redirect); redirects are not followed",
            code="upstream_redirect",
        )
        raise attempt.error
