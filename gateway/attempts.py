"""The attempt loop: every call the gateway makes to a backend on a client's behalf — a model
call (:mod:`gateway.hops.upstream`), a realtime handshake (:mod:`gateway.realtime.handshake`) —
walks the same steps, written once here::

    plan      the backends in order, ``tries`` times each (:class:`AttemptPlan`)
    health    each attempt begun and settled in passive health; a retry to the backend that
              just failed only within its retry budget (:mod:`gateway.fleet.health`)
    connect   the caller's :meth:`AttemptLoop.connect`: the request sent, its answer's head
    classify  a failure that raised, a redirect (refused), a retryable status, an answer
    backoff   the wait before the next attempt, booked as the request's ``backoff``

Retries follow docs/spec.md §13: an LLM call is a non-idempotent POST (RFC 9110 §9.2.2), so a
request is sent again only when no completion can have been produced — connect failures, and
429/502/503/504 answers — unless the plan allows a retry after a timeout too (a route's
``retry_on_timeout``; a WebSocket handshake, which delivered nothing). Exponential backoff with
full jitter from 100 ms; ``Retry-After`` is honoured up to :data:`RETRY_AFTER_CAP` s, beyond
that the backend is given up for this request and the next one (fallback) is tried — or, on the
last backend, the answer is what the caller gets. The time actually spent asleep between
attempts is the request's ``backoff`` (docs/spec.md §6): neither the upstream's time nor the
gateway's own. Redirects are never followed and never passed on (§13): a key is never sent,
and a client never sent, to a host that config did not name.

Every attempt's outcome is settled in passive health — here when the attempt fails before its
answer is used or answers a retryable status (before the retry is decided), by the caller
otherwise (a model call's at the request's end, a realtime session's at the session's end).

An :class:`Attempt` is opened by :func:`open_attempt` wherever the gateway talks to an upstream
(the MCP exchanges too, which are not retried): numbered, on the request's list, its socket
window begun.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Generic, NoReturn, Protocol, TypeVar

from gateway.context import Attempt, RequestContext
from gateway.errors import GatewayError, UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.fleet.health import CONNECTION_FAILED, SUCCESS, Health, RoutePlan, answer_outcome
from gateway.routes import Backend
from gateway.streaming.bodies import upstream_answered
from gateway.transports import Transport, UpstreamResponse

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 2.0
RETRY_AFTER_CAP = 2.0

_B = TypeVar("_B")


class Answered(Protocol):
    """What a connect returns: the upstream's answer, with its HTTP status."""

    @property
    def status(self) -> int: ...


#: what the caller's connect needs of one request (its body; the subprotocols offered)
_R = TypeVar("_R", contravariant=True)
#: the caller's answer (an HTTP response; a WebSocket, or the handshake's refusal)
_A = TypeVar("_A", bound=Answered)


class AttemptPlan(Generic[_B]):
    """Which backend each attempt goes to: every backend in order, ``tries`` times each; and
    what the plan allows and tells: a retry after a timeout, the route's fleet plan and the
    affinity ranking the order followed (for each attempt's span).

    >>> plan = AttemptPlan(("a", "b"), tries=2)
    >>> [plan.next() for _ in range(5)]
    ['a', 'a', 'b', 'b', None]
    """

    __slots__ = (
        "_backend",
        "_backends",
        "_tried",
        "_tries",
        "number",
        "ranked",
        "retry_on_timeout",
        "route",
    )

    def __init__(
        self,
        backends: Sequence[_B],
        tries: int,
        retry_on_timeout: bool = False,
        route: RoutePlan | None = None,
        ranked: Sequence[Backend] | None = None,
    ) -> None:
        self._backends = backends
        self._tries = tries
        self._backend = 0
        self._tried = 0
        #: 1-based number of the attempt last handed out
        self.number = 0
        #: a timeout after the request was sent may be retried
        self.retry_on_timeout = retry_on_timeout
        #: the route's fleet plan (None: no health, or not a route's backends)
        self.route = route
        #: the backends in the hash order of the request's affinity key (None: no key)
        self.ranked = ranked

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


def open_attempt(ctx: RequestContext, backend: Backend, number: int, span_id: int) -> Attempt:
    """An attempt on ``backend``, on the request's list, its socket window begun now (the
    transport moves it to its socket's times); the first one is when the request went upstream
    until the transport says better."""
    attempt = Attempt(backend, number, span_id)
    ctx.attempts.append(attempt)
    if ctx.timeline.upstream_sent is None:
        ctx.timeline.upstream_sent = attempt.start
    return attempt


async def send_once(
    ctx: RequestContext,
    attempt: Attempt,
    transport: Transport,
    request: tuple[str, str, list[tuple[str, str]], bytes | None],
) -> UpstreamResponse:
    """One request of an attempt that is not retried (an MCP exchange, an A2A call):
    ``request`` is (method, url, headers, body); a failure is the attempt's error and ends it,
    an answer's status and head time are the attempt's."""
    method, url, headers, body = request
    try:
        resp = await transport.request(method, url, headers, body)
    except GatewayError as exc:
        attempt.error = exc
        attempt.finished()
        raise
    attempt.status = resp.status
    upstream_answered(ctx, attempt, resp)
    return resp


def retryable(exc: GatewayError, retry_on_timeout: bool) -> bool:
    """Whether a failure may be sent again: nothing reached the upstream, or the plan allows
    it (docs/spec.md §13)."""
    if isinstance(exc, UpstreamConnectError):
        return True
    if isinstance(exc, UpstreamError | UpstreamTimeout):
        return not exc.request_sent or retry_on_timeout
    return False


def backoff(retry_number: int) -> float:
    """Exponential backoff with full jitter from :data:`BACKOFF_BASE_S`, capped."""
    return random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (retry_number - 1)))


def retry_after_seconds(raw: bytes | str | None) -> float | None:
    """A ``Retry-After`` in seconds (None: absent, or an HTTP-date, treated as no hint).

    >>> retry_after_seconds(b"1.5"), retry_after_seconds("-3"), retry_after_seconds(None)
    (1.5, 0.0, None)
    """
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None


async def wait(ctx: RequestContext, delay: float) -> None:
    """Sleep between attempts; the time actually asleep (a cancelled wait too) is the
    request's backoff (docs/spec.md §6)."""
    asleep = time.perf_counter()
    try:
        await asyncio.sleep(delay)
    finally:
        ctx.timeline.backoff += time.perf_counter() - asleep


def _is_redirect(status: int) -> bool:
    return 300 <= status < 400 and status != 304


class AttemptLoop(Generic[_R, _A]):
    """The attempts of one call upstream (one loop per app, no per-request state: habit 2).

    A caller subclasses it with what differs: :meth:`connect` (send the request ``_R``, return
    the answer ``_A`` at its head, or raise a :class:`GatewayError` when there is none),
    :meth:`retry_after` (the answer's hint) and :meth:`let_go` (an answer not used: close it).
    """

    def __init__(self, health: Health | None, new_span_id: Callable[[], int]) -> None:
        #: passive health, retry budget and strategies (None: configured order, no budget)
        self.health = health
        self._new_span_id = new_span_id

    async def connect(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt, request: _R
    ) -> _A:
        raise NotImplementedError

    def retry_after(self, answer: _A) -> float | None:
        """The answer's ``Retry-After`` in seconds (asked of a retryable status only)."""
        raise NotImplementedError

    async def let_go(self, answer: _A, attempt: Attempt) -> None:
        """An answer that is not used (retried, or a redirect): release what it holds."""
        raise NotImplementedError

    async def attempts(
        self, ctx: RequestContext, plan: AttemptPlan[Backend], request: _R
    ) -> tuple[_A, Attempt]:
        """The answer to use — any status but a redirect; a retryable one when no attempt
        follows — and its attempt (not settled yet), or the last attempt's
        :class:`GatewayError` when every attempt failed."""
        health = self.health
        delay = 0.0
        while (backend := plan.next()) is not None:
            if delay:
                await wait(ctx, delay)
            attempt = open_attempt(ctx, backend, plan.number, self._new_span_id())
            if health is not None:
                health.begin(attempt, plan.is_retry, ctx.model)
                route = plan.route
                if route is not None and route.fleet:  # what the span tells of the choice
                    _routed(health, attempt, route, plan.ranked)
            try:
                answer = await self.connect(ctx, backend, attempt, request)
            except GatewayError as exc:
                attempt.finished()
                attempt.error = exc
                self._settle(attempt, CONNECTION_FAILED, None)
                if retryable(exc, plan.retry_on_timeout) and self._another(ctx, plan, backend):
                    delay = backoff(plan.number)
                    continue
                raise
            attempt.first_byte = time.perf_counter()
            attempt.status = status = answer.status
            if _is_redirect(status):
                self._settle(attempt, SUCCESS, ctx.model)  # it answered; config sent us astray
                await self._refuse_redirect(answer, attempt)
            if status in RETRYABLE_STATUS:
                # settled before the retry is decided, as a failure that raised is: when this
                # 503 is the one that ejects the backend (or the pair), it is not retried there
                # (a retry would be a trial whose success restores it at once); when the answer
                # is used instead, it was settled here with the outcome the request's end gives
                self._settle(attempt, answer_outcome(status, ctx.model), ctx.model)
                next_delay = self._retry_delay(ctx, answer, backend, plan)
                if next_delay is not None:
                    await self.let_go(answer, attempt)
                    attempt.finished()
                    delay = next_delay
                    continue
            return answer, attempt
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    def _settle(self, attempt: Attempt, outcome: int, model: str | None) -> None:
        if self.health is not None:
            self.health.settle(attempt, outcome, model)

    def _another(self, ctx: RequestContext, plan: AttemptPlan[Backend], backend: Backend) -> bool:
        """Whether another attempt follows a retryable failure on ``backend``: a retry to it
        needs its budget (and it, and its pair for the model, still in rotation), else the
        next backend is tried."""
        health = self.health
        if health is not None and plan.next_is_retry and not health.may_retry(backend, ctx.model):
            plan.skip_backend()
        return plan.more

    def _retry_delay(
        self, ctx: RequestContext, answer: _A, backend: Backend, plan: AttemptPlan[Backend]
    ) -> float | None:
        """After a 429/502/503/504: the delay before the next attempt, or None to use it."""
        hint = self.retry_after(answer)
        if hint is not None and hint > RETRY_AFTER_CAP:
            # more patience asked than we have: the next backend, or this answer on the last
            if plan.on_last_backend:
                return None
            plan.skip_backend()
            return 0.0
        if not self._another(ctx, plan, backend):
            return None
        return hint if hint is not None else backoff(plan.number)

    async def _refuse_redirect(self, answer: _A, attempt: Attempt) -> NoReturn:
        await self.let_go(answer, attempt)
        attempt.finished()
        attempt.error = UpstreamError(
            f"upstream answered {answer.status} (a redirect); redirects are not followed",
            code="upstream_redirect",
        )
        raise attempt.error


def _routed(
    health: Health, attempt: Attempt, route: RoutePlan, ranked: Sequence[Backend] | None
) -> None:
    """What the attempt's span tells of the choice: affinity, the backend's load."""
    if route.rendezvous is not None:
        if ranked is None:
            attempt.affinity = "none"
        else:
            attempt.affinity = "hit" if attempt.backend is ranked[0] else "spill"
    if route.watched:
        load = health.load(attempt.backend)
        if load is not None:
            attempt.load = (load.queue, load.kv_cache)


__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "RETRYABLE_STATUS",
    "RETRY_AFTER_CAP",
    "Answered",
    "AttemptLoop",
    "AttemptPlan",
    "backoff",
    "open_attempt",
    "retry_after_seconds",
    "retryable",
    "wait",
]
