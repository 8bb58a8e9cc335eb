"""The upstream handshake of a realtime session: the upstream hop for a WebSocket
(docs/spec.md §19).

The attempt loop of :mod:`gateway.attempts`, with the opening handshake as its connect: the
route's strategy over the backends in rotation for the model (passive health), retries with
backoff and fallback, the retry budget, ``Retry-After`` and its cap. A failed handshake
delivered nothing, so connect failures, timeouts and 429/502/503/504 answers are retried like a
refused connection; redirects are never followed (§13). When every attempt failed, the last
error is what the client gets, as HTTP: 502/504, or the upstream's own error status and body.

The upstream URL is the backend's with ``http`` → ``ws`` and ``https`` → ``wss``,
``/realtime`` and the client's query string; the headers are the client's forwarded ones
without its own handshake's, plus the backend's key; no proxy (the upstream URL comes only
from config). ``mock://`` backends answer in process (:class:`MockSocket`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import orjson
from websockets.datastructures import Headers
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from gateway.attempts import RETRYABLE_STATUS, AttemptLoop, AttemptPlan, retry_after_seconds
from gateway.context import Attempt, RequestContext
from gateway.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
    error_body,
)
from gateway.fleet.health import Health, answer_outcome
from gateway.mock.engine import MockSettings
from gateway.mock.realtime import handshake_refusal
from gateway.realtime.upstream_socket import (
    MockSocket,
    UpstreamSocket,
    WebSocketsSocket,
    open_websocket,
)
from gateway.routes import Backend

#: request headers that belong to the client's own WebSocket handshake: the upstream handshake
#: makes its own (the subprotocols offered upstream are chosen apart, without the key)
_OWN_HANDSHAKE = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
        "origin",
        "user-agent",
    }
)
#: what one session's handshake offers upstream: the subprotocols, the largest message
Offer = tuple[Sequence[str], int]


class UpstreamRefused(GatewayError):
    """The upstream answered the handshake with an HTTP status instead of 101: its status and
    body go to the client (docs/spec.md §19), as an upstream error answer does for HTTP.

    It is the handshake's answer as the attempt loop reads it (a status, a ``Retry-After``),
    raised once no attempt follows."""

    type = "upstream_error"

    def __init__(self, status: int, body: bytes | None, retry_after: float | None) -> None:
        text = (body or b"").decode("utf-8", "replace")
        super().__init__(f"upstream refused the WebSocket handshake with {status}: {text[:200]}")
        self.status = status
        self.retry_after = retry_after
        self.should_retry = status in RETRYABLE_STATUS
        self._body = body

    def body(self) -> bytes:
        body = self._body
        if body:
            with contextlib.suppress(orjson.JSONDecodeError):
                if isinstance(orjson.loads(body), dict):
                    return body  # the upstream's own error shape, as it sent it
        return error_body(self.message, self.type, "upstream_handshake_refused")


def upstream_headers(ctx: RequestContext, backend: Backend) -> list[tuple[str, str]]:
    """What the upstream handshake sends: the client's forwarded headers (hygiene applied by
    the edge: no credential, no hop-by-hop header) without those of the client's own WebSocket
    handshake, plus the backend's key."""
    forward = [(k, v) for k, v in ctx.upstream_headers if k.lower() not in _OWN_HANDSHAKE]
    return backend.request_headers(forward)


class Handshake(AttemptLoop[Offer, UpstreamSocket | UpstreamRefused]):
    """Opens the upstream of a session: attempts, retries, fallback (one per app)."""

    def __init__(
        self,
        health: Health,
        attempt_headers: Callable[[RequestContext, Attempt], list[tuple[str, str]]] | None = None,
        new_span_id: Callable[[], int] = lambda: 0,
    ) -> None:
        super().__init__(health, new_span_id)
        #: (ctx, attempt) -> traceparent headers of the attempt's span (None: not tracing)
        self._attempt_headers = attempt_headers

    async def open(
        self,
        ctx: RequestContext,
        backends: tuple[Backend, ...],
        retries: int,
        offered: Sequence[str],
        max_size: int,
    ) -> tuple[UpstreamSocket, Attempt]:
        """The upstream socket (its handshake done) and its attempt — settled when the session
        ends — or the last attempt's :class:`GatewayError` when every attempt failed."""
        health, model = self.health, ctx.model
        assert health is not None
        # a failed handshake delivered nothing: a timeout is retried like a refused connection
        order = health.order(backends, model)
        plan = AttemptPlan(order, retries + 1, retry_on_timeout=True)
        answer, attempt = await self.attempts(ctx, plan, (offered, max_size))
        if isinstance(answer, UpstreamRefused):  # no attempt follows: the client gets it
            attempt.finished()
            attempt.error = answer
            # (a retryable status was settled by the loop already: settling again is nothing)
            health.settle(attempt, answer_outcome(answer.status, model), model)
            raise answer
        return answer, attempt

    async def connect(
        self, ctx: RequestContext, backend: Backend, attempt: Attempt, request: Offer
    ) -> UpstreamSocket | UpstreamRefused:
        offered, max_size = request
        headers = upstream_headers(ctx, backend)
        if self._attempt_headers is not None:
            headers = [*headers, *self._attempt_headers(ctx, attempt)]
        if backend.config.is_mock:
            return await _connect_mock(backend, ctx, headers, offered)
        url = backend.url_for(ctx.path, ctx.query)
        return await _connect_websockets(backend, url, headers, offered, max_size)

    def retry_after(self, answer: UpstreamSocket | UpstreamRefused) -> float | None:
        return answer.retry_after if isinstance(answer, UpstreamRefused) else None

    async def let_go(self, answer: UpstreamSocket | UpstreamRefused, attempt: Attempt) -> None:
        """A refusal is the attempt's error (a refused handshake holds no connection)."""
        if isinstance(answer, UpstreamRefused):
            attempt.error = answer


def _ws_url(http_url: str) -> str:
    if http_url.startswith("https://"):
        return "wss://" + http_url[8:]
    if http_url.startswith("http://"):
        return "ws://" + http_url[7:]
    return http_url


async def _connect_websockets(
    backend: Backend,
    url: str,
    headers: list[tuple[str, str]],
    subprotocols: Sequence[str],
    max_size: int,
) -> WebSocketsSocket | UpstreamRefused:
    """The socket, or the HTTP status the upstream answered instead of 101 (a redirect too:
    the loop refuses it); raises when there was no answer."""
    try:
        return await open_websocket(
            _ws_url(url), headers, subprotocols, max_size, backend.config.read_timeout_s
        )
    except InvalidStatus as exc:
        resp = exc.response
        body = bytes(resp.body) if resp.body is not None else None
        hint = retry_after_seconds(_header(resp.headers, "retry-after"))
        return UpstreamRefused(resp.status_code, body, hint)
    except TimeoutError as exc:
        raise UpstreamTimeout(
            f"upstream {backend.name}: the WebSocket handshake timed out "
            f"({backend.config.read_timeout_s:g} s)",
            code="upstream_timeout",
        ) from exc
    except (InvalidHandshake, InvalidURI) as exc:
        raise UpstreamError(
            f"upstream {backend.name}: invalid WebSocket handshake: {exc}",
            code="upstream_handshake_failed",
        ) from exc
    except OSError as exc:
        raise UpstreamConnectError(f"upstream {backend.name} unreachable: {exc}") from exc


def _header(headers: Headers | None, name: str) -> str | None:
    """The first value of ``name`` (as :func:`gateway.headers.header_value` reads an HTTP
    answer's): a repeated header is no error (``Headers.get`` raises on one)."""
    values = headers.get_all(name) if headers is not None else []
    return values[0] if values else None


async def _connect_mock(
    backend: Backend, ctx: RequestContext, headers: list[tuple[str, str]], offered: Sequence[str]
) -> MockSocket | UpstreamRefused:
    model = ctx.model or ""
    refusal = handshake_refusal(model)
    if refusal is not None:
        status, body = refusal
        return UpstreamRefused(status, body, None)
    try:
        settings = MockSettings.from_url(backend.config.url).from_headers(dict(headers))
    except ValueError as exc:
        return UpstreamRefused(400, error_body(str(exc), "invalid_request_error"), None)
    if settings.latency_ms:
        await asyncio.sleep(settings.latency_ms / 1000)
    sock = MockSocket(settings, model, "realtime" if "realtime" in offered else None)
    await sock.open()
    return sock


__all__ = ["Handshake", "Offer", "UpstreamRefused", "upstream_headers"]
