"""The upstream side of a realtime session: one socket interface, two implementations.

- :class:`WebSocketsSocket`: ``websockets``' asyncio client (a maintained library: the opening
  handshake, masking, fragmentation, pings and the closing handshake are its work). The backend
  URL with ``http`` → ``ws`` and ``https`` → ``wss``, ``/realtime`` and the client's query string
  (docs/spec.md §19); the backend's own key; redirects are never followed (§13); no proxy from
  the environment (the upstream URL comes only from config); no per-message deflate.
- :class:`MockSocket`: ``mock://`` backends, in process (:mod:`gateway.mock.realtime`), so the
  embedded default answers realtime sessions without any server.

Both raise :class:`Closed` from :meth:`recv` / :meth:`send` once the connection is over, with
the close code and reason that concern the client: the upstream's close frame when it closed
first; ours when ``websockets`` closed it (a message over ``max_message_bytes`` → 1009, a
keepalive ping unanswered → 1011); and ``lost`` when the connection ended without any close
frame (the client then gets 1011).

:func:`open_upstream` is the handshake as the upstream hop makes an HTTP request: the route's
strategy over the backends in rotation for the model (passive health), retries with backoff and
fallback, the retry budget — a failed handshake delivered nothing, so connect failures,
timeouts and 429/502/503/504 answers are retried like a refused connection. When every attempt
failed, the last error is what the client gets, as HTTP: 502/504, or the upstream's own error
status and body.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN
from websockets.typing import Subprotocol

from gateway.context import Attempt, RequestContext
from gateway.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
    error_body,
)
from gateway.hops.health import CONNECTION_FAILED, Health, answer_outcome
from gateway.hops.upstream import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    RETRY_AFTER_CAP,
    RETRYABLE_STATUS,
    AttemptPlan,
)
from gateway.mock.engine import MockSettings
from gateway.mock.realtime import MockRealtime, handshake_refusal
from gateway.realtime.server_protocol import Take
from gateway.routes import Backend

Message = str | bytes
_TEXT, _BINARY, _CONT = Opcode.TEXT, Opcode.BINARY, Opcode.CONT

#: incoming messages buffered from the upstream before reading from its socket pauses (each
#: at most ``max_message_bytes``): a slow client slows the upstream instead of growing memory
UPSTREAM_QUEUE = 4
#: a closing handshake the other end does not finish within this is cut (docs/spec.md §19:
#: the client gone, the upstream connection is closed within 1 s)
CLOSE_TIMEOUT_S = 0.9
#: keepalive pings on the upstream hop (uvicorn pings the client's hop the same way)
PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
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


class Closed(Exception):
    """The upstream connection is over: what the client's close should say."""

    def __init__(self, code: int, reason: str, lost: bool = False) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason
        #: it ended without a close frame either way (the client gets 1011)
        self.lost = lost


class UpstreamRefused(GatewayError):
    """The upstream answered the handshake with an HTTP status instead of 101: its status and
    body go to the client (docs/spec.md §19), as an upstream error answer does for HTTP."""

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


class UpstreamSocket(Protocol):
    #: the subprotocol the upstream selected (None: none)
    subprotocol: str | None

    @property
    def read_at(self) -> float:
        """``time.perf_counter()`` of the socket read that delivered the last message."""
        ...

    async def recv(self) -> Message: ...

    async def send(self, data: bytes, text: bool) -> None:
        """One message (UTF-8 ``data`` when ``text``)."""
        ...

    def relayed(self) -> None:
        """The relay wrote a message :meth:`recv` gave it."""
        ...

    async def close(self, code: int, reason: str) -> None: ...


# ---------------------------------------------------------------- websockets


class _StampedConnection(ClientConnection):
    """``websockets``' client connection with the time of each socket read and the relay's
    direct path.

    While a relay is attached (:attr:`relay`), each whole message is offered to it in the
    ``data_received`` call that read it, when nothing read before it is still queued; the relay
    writes it to the client at once or declines (the client's write buffer is full, the client
    is closing), and then the message goes to ``recv()`` as usual: ``websockets`` pauses reading
    beyond :data:`UPSTREAM_QUEUE` queued messages, the bounded queue that slows the upstream.
    :attr:`queued` counts the messages handed to ``recv()`` that the relay has not written yet
    (it calls :meth:`WebSocketsSocket.relayed` after each), so a message is never written
    before one read earlier.

    What this reaches into: ``process_event`` (``websockets``' hook, "overridden in
    subclasses", the same from 15.0 to 17.x) and ``paused`` (its flow-control flag, set by
    ``pause_writing``); the bound is in ``pyproject.toml``.
    """

    read_at = 0.0
    relay: Take | None = None
    queued = 0

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        super().data_received(data)

    def process_event(self, event: Any) -> None:
        if type(event) is Frame and event.fin:
            opcode = event.opcode
            if opcode is _TEXT or opcode is _BINARY:
                relay = self.relay
                if (
                    relay is not None
                    and not self.queued
                    # a parsed frame's payload: bytes-like (no deflate on this hop)
                    and relay(event.data, opcode is _TEXT, self.read_at)  # type: ignore[arg-type]
                ):
                    return
                self.queued += 1
            elif opcode is _CONT:  # the last frame of a fragmented message: recv() has it
                self.queued += 1
        super().process_event(event)

    def write(self, data: bytes, text: bool) -> bool:
        """One message upstream as one frame, now; False when the connection is not open or
        its write buffer is over the high-water mark (nothing written then)."""
        protocol = self.protocol
        if self.paused or protocol.state is not OPEN:
            return False
        if text:
            protocol.send_text(data)
        else:
            protocol.send_binary(data)
        transport = self.transport
        for chunk in protocol.data_to_send():
            transport.write(chunk)
        return True


class _Connect(connect):
    def process_redirect(self, exc: Exception) -> Exception | str:
        # docs/spec.md §13: a redirect is never followed (a key is never sent to a host the
        # config did not name); the 3xx is the handshake's failure
        return exc


def _closed(exc: ConnectionClosed) -> Closed:
    rcvd, sent = exc.rcvd, exc.sent
    if rcvd is not None and (sent is None or exc.rcvd_then_sent):  # the upstream closed first
        return Closed(rcvd.code, rcvd.reason)
    if sent is not None:  # websockets closed it: a message too big (1009), no pong (1011)
        return Closed(sent.code, sent.reason)
    return Closed(1011, "upstream connection lost", lost=True)


class WebSocketsSocket:
    __slots__ = ("_ws", "subprotocol")

    def __init__(self, ws: _StampedConnection) -> None:
        self._ws = ws
        self.subprotocol: str | None = ws.subprotocol

    @property
    def read_at(self) -> float:
        return self._ws.read_at

    async def recv(self) -> Message:
        try:
            return await self._ws.recv()
        except ConnectionClosed as exc:
            raise _closed(exc) from None

    async def send(self, data: bytes, text: bool) -> None:
        try:
            await self._ws.send(data, text=text)
        except ConnectionClosed as exc:
            raise _closed(exc) from None

    # the direct path (see _StampedConnection)

    def attach(self, relay: Take | None) -> None:
        """Offer each whole message read to ``relay`` (None: detach)."""
        self._ws.relay = relay

    def relayed(self) -> None:
        """The relay wrote a message :meth:`recv` gave it."""
        ws = self._ws
        if ws.queued:
            ws.queued -= 1

    @property
    def direct_write(self) -> Callable[[bytes, bool], bool]:
        """One message upstream as one frame, now; False when the connection is not open or its
        write buffer is over the high-water mark (nothing written then). The connection's own
        method: no wrapper's call per message."""
        return self._ws.write

    async def close(self, code: int, reason: str) -> None:
        ws = self._ws
        ws.relay = None
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await ws.close(code, reason)
        except (TimeoutError, OSError):
            ws.transport.abort()


def _ws_url(http_url: str) -> str:
    if http_url.startswith("https://"):
        return "wss://" + http_url[8:]
    if http_url.startswith("http://"):
        return "ws://" + http_url[7:]
    return http_url


def _retry_after(headers: Any) -> float | None:
    raw = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


async def _connect_websockets(
    backend: Backend,
    url: str,
    headers: list[tuple[str, str]],
    subprotocols: Sequence[str],
    max_size: int,
) -> WebSocketsSocket:
    try:
        ws = await _Connect(
            _ws_url(url),
            additional_headers=headers,
            user_agent_header=None,
            subprotocols=[Subprotocol(p) for p in subprotocols] if subprotocols else None,
            compression=None,
            proxy=None,
            open_timeout=backend.config.read_timeout_s,
            ping_interval=PING_INTERVAL_S,
            ping_timeout=PING_TIMEOUT_S,
            close_timeout=CLOSE_TIMEOUT_S,
            max_size=max_size,
            max_queue=UPSTREAM_QUEUE,
            create_connection=_StampedConnection,
        )
    except InvalidStatus as exc:
        resp = exc.response
        status = resp.status_code
        if 300 <= status < 400:
            raise UpstreamError(
                f"upstream answered {status} (a redirect); redirects are not followed",
                code="upstream_redirect",
            ) from exc
        body = bytes(resp.body) if resp.body is not None else None
        raise UpstreamRefused(status, body, _retry_after(resp.headers)) from exc
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
    assert isinstance(ws, _StampedConnection)
    return WebSocketsSocket(ws)


# ---------------------------------------------------------------- mock://


class MockSocket:
    """A ``mock://`` backend's realtime session, in process (no socket, no framing)."""

    __slots__ = ("_closed", "_inbox", "_session", "read_at", "subprotocol")

    def __init__(self, settings: MockSettings, model: str, subprotocol: str | None) -> None:
        self.subprotocol = subprotocol
        self.read_at = 0.0
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue(UPSTREAM_QUEUE)
        self._closed: Closed | None = None
        self._session = MockRealtime(settings, model, self._emit)

    async def _emit(self, text: str) -> None:
        if self._closed is not None:
            raise self._closed
        await self._inbox.put(text)

    async def open(self) -> None:
        await self._session.open()

    async def recv(self) -> Message:
        item = await self._inbox.get()
        if item is None:
            assert self._closed is not None
            raise self._closed
        self.read_at = time.perf_counter()
        return item

    async def send(self, data: bytes, text: bool) -> None:
        if self._closed is not None:
            raise self._closed
        await self._session.receive(data.decode() if text else data)

    def relayed(self) -> None:
        return None

    async def close(self, code: int, reason: str) -> None:
        if self._closed is None:
            self._closed = Closed(code, reason)
            await self._session.aclose()
            while not self._inbox.empty():  # nobody reads them any more
                self._inbox.get_nowait()
            self._inbox.put_nowait(None)


async def _connect_mock(
    backend: Backend, ctx: RequestContext, headers: list[tuple[str, str]], offered: Sequence[str]
) -> MockSocket:
    model = ctx.model or ""
    refusal = handshake_refusal(model)
    if refusal is not None:
        status, body = refusal
        raise UpstreamRefused(status, body, None)
    try:
        settings = MockSettings.from_url(backend.config.url).from_headers(dict(headers))
    except ValueError as exc:
        raise UpstreamRefused(400, error_body(str(exc), "invalid_request_error"), None) from exc
    if settings.latency_ms:
        await asyncio.sleep(settings.latency_ms / 1000)
    sock = MockSocket(settings, model, "realtime" if "realtime" in offered else None)
    await sock.open()
    return sock


# ---------------------------------------------------------------- the handshake hop


def upstream_headers(ctx: RequestContext, backend: Backend) -> list[tuple[str, str]]:
    """What the upstream handshake sends: the client's forwarded headers (hygiene applied by
    the edge: no credential, no hop-by-hop header) without those of the client's own WebSocket
    handshake, plus the backend's key."""
    forward = [(k, v) for k, v in ctx.upstream_headers if k.lower() not in _OWN_HANDSHAKE]
    return backend.request_headers(forward)


class Handshake:
    """Opens the upstream of a session: attempts, retries, fallback (one per app)."""

    def __init__(
        self,
        health: Health,
        attempt_headers: Any = None,
        new_span_id: Any = lambda: 0,
    ) -> None:
        self.health = health
        #: (ctx, attempt) -> traceparent headers of the attempt's span (None: not tracing)
        self._attempt_headers = attempt_headers
        self._new_span_id = new_span_id

    async def open(
        self,
        ctx: RequestContext,
        backends: tuple[Backend, ...],
        retries: int,
        offered: Sequence[str],
        max_size: int,
    ) -> tuple[UpstreamSocket, Attempt]:
        """The upstream socket (its handshake done) and its attempt, or the last attempt's
        :class:`GatewayError` when every attempt failed."""
        health, model = self.health, ctx.model
        plan = AttemptPlan(health.order(backends, model), retries + 1)
        delay = 0.0
        while (backend := plan.next()) is not None:
            if delay:
                await _wait(ctx, delay)
            attempt = Attempt(backend, plan.number, self._new_span_id())
            ctx.attempts.append(attempt)
            if ctx.timeline.upstream_sent is None:
                ctx.timeline.upstream_sent = attempt.start
            health.begin(attempt, plan.is_retry, model)
            try:
                sock = await self._connect(ctx, backend, attempt, offered, max_size)
            except UpstreamRefused as exc:
                attempt.finished()
                attempt.status, attempt.error = exc.status, exc
                health.settle(attempt, answer_outcome(exc.status, model), model)
                next_delay = self._after_refusal(ctx, exc, backend, plan)
                if next_delay is None:
                    raise
                delay = next_delay
                continue
            except GatewayError as exc:
                attempt.finished()
                attempt.error = exc
                health.settle(attempt, CONNECTION_FAILED, None)
                if exc.code != "upstream_redirect" and self._another(ctx, plan, backend):
                    delay = _backoff(plan.number)
                    continue
                raise
            attempt.first_byte = ctx.timeline.upstream_first_byte = time.perf_counter()
            attempt.status = 101
            return sock, attempt  # settled when the session ends
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    async def _connect(
        self,
        ctx: RequestContext,
        backend: Backend,
        attempt: Attempt,
        offered: Sequence[str],
        max_size: int,
    ) -> UpstreamSocket:
        headers = upstream_headers(ctx, backend)
        if self._attempt_headers is not None:
            headers = [*headers, *self._attempt_headers(ctx, attempt)]
        if backend.config.is_mock:
            return await _connect_mock(backend, ctx, headers, offered)
        url = backend.url_for(ctx.path, ctx.query)
        return await _connect_websockets(backend, url, headers, offered, max_size)

    def _after_refusal(
        self,
        ctx: RequestContext,
        exc: UpstreamRefused,
        backend: Backend,
        plan: AttemptPlan[Backend],
    ) -> float | None:
        """After a status answer: the delay before the next attempt, or None to give it to the
        client (not retryable, or no attempt left)."""
        if exc.status not in RETRYABLE_STATUS:
            return None
        hint = exc.retry_after
        if hint is not None and hint > RETRY_AFTER_CAP:
            if plan.on_last_backend:
                return None
            plan.skip_backend()
            return 0.0
        if not self._another(ctx, plan, backend):
            return None
        return hint if hint is not None else _backoff(plan.number)

    def _another(self, ctx: RequestContext, plan: AttemptPlan[Backend], backend: Backend) -> bool:
        if plan.next_is_retry and not self.health.may_retry(backend, ctx.model):
            plan.skip_backend()
        return plan.more


def _backoff(retry_number: int) -> float:
    """Exponential backoff with full jitter from 100 ms (as the HTTP attempts, §13)."""
    return random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (retry_number - 1)))


async def _wait(ctx: RequestContext, delay: float) -> None:
    asleep = time.perf_counter()
    try:
        await asyncio.sleep(delay)
    finally:
        ctx.timeline.backoff += time.perf_counter() - asleep


__all__ = [
    "Closed",
    "Handshake",
    "Message",
    "MockSocket",
    "UpstreamRefused",
    "UpstreamSocket",
    "WebSocketsSocket",
    "upstream_headers",
]
