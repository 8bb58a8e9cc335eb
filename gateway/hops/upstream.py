"""The upstream hop: attempts, backoff and fallback over pooled per-backend transports.

Retries follow SPEC §13: every LLM call is a non-idempotent POST (RFC 9110 §9.2.2), so a
request is sent again only when no completion can have been produced — connect failures, and
429/502/503/504 answers — unless the route sets ``retry_on_timeout``. Retries happen before any
byte reaches the client (this hop returns at the upstream's headers). Exponential backoff with
full jitter from 100 ms; ``Retry-After`` is honoured up to :data:`RETRY_AFTER_CAP` s, beyond
that the backend is given up for this request and the next one (fallback) is tried.
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


def _is_redirect(status: int) -> bool:
    return 300 <= status < 400 and status != 304


class Upstream:
    """Sends a request upstream; one per app, no per-request state (habit 2)."""

    def __init__(
        self,
        attempt_headers: AttemptHeaders | None = None,
        new_span_id: Callable[[], int] = lambda: 0,
        attempt_scope: AttemptScope | None = None,
    ) -> None:
        #: None keeps the attempt path bare when nothing needs per-attempt headers
        self._attempt_headers = attempt_headers
        self._new_span_id = new_span_id
        self._attempt_scope = attempt_scope

    async def forward(
        self,
        ctx: RequestContext,
        backends: tuple[Backend, ...],
        body: Body,
        retries: int = 0,
        retry_on_timeout: bool = False,
    ) -> tuple[UpstreamResponse, Attempt]:
        """Return the response to relay (headers in, body unread), or raise the last
        attempt's :class:`GatewayError` when every attempt failed."""
        if not isinstance(body, bytes | None):
            retries = 0  # a streamed request body can be sent once only
            backends = backends[:1]
        plan = AttemptPlan(backends, retries + 1)
        delay = 0.0
        while (backend := plan.next()) is not None:
            if delay:
                await asyncio.sleep(delay)
            attempt = self._begin(ctx, backend, plan.number)
            try:
                resp = await self._send(ctx, backend, attempt, body)
            except GatewayError as exc:
                attempt.finished()
                attempt.error = exc
                if plan.more and _retry_allowed(exc, retry_on_timeout):
                    delay = _backoff(plan.number)
                    continue
                raise
            attempt.first_byte = time.perf_counter()
            attempt.status = status = resp.status
            if _is_redirect(status):
                await self._refuse_redirect(resp, attempt)
            if status in RETRYABLE_STATUS and plan.more:
                hint = _retry_after(resp)
                give_up = hint is not None and hint > RETRY_AFTER_CAP
                if not (give_up and plan.on_last_backend):
                    await resp.aclose()
                    attempt.finished()
                    if give_up:  # more patience asked than we have: the next backend
                        plan.skip_backend()
                        delay = 0.0
                    else:
                        delay = hint if hint is not None else _backoff(plan.number)
                    continue
            ctx.timeline.upstream_first_byte = attempt.first_byte
            return resp, attempt
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

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

    def _begin(self, ctx: RequestContext, backend: Backend, number: int) -> Attempt:
        attempt = Attempt(backend, number, self._new_span_id())
        ctx.attempts.append(attempt)
        if ctx.timeline.upstream_sent is None:
            ctx.timeline.upstream_sent = attempt.start
        return attempt

    def _headers(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt
    ) -> list[tuple[str, str]]:
        headers = ctx.upstream_headers
        if backend.auth_header is not None:
            headers = [*headers, backend.auth_header]
        if self._attempt_headers is not None:
            headers = [*headers, *self._attempt_headers(ctx, attempt)]
        return headers

    @staticmethod
    async def _refuse_redirect(resp: UpstreamResponse, attempt: Attempt) -> None:
        # SPEC §13: never followed, never passed on — a key is never sent, and a client
        # never sent, to a host that config did not name
        await resp.aclose()
        attempt.finished()
        attempt.error = UpstreamError(
            f"upstream answered {resp.status} (a redirect); redirects are not followed",
            code="upstream_redirect",
        )
        raise attempt.error
