"""The gateway's HTTP/1.1 server edge: an asyncio protocol on httptools serving the ASGI app.

:mod:`gateway.server` runs it (the lifespan, the listening socket, signals, the SIGTERM drain;
:mod:`gateway.supervisor` the ``--workers``): one :class:`Http1Protocol` per accepted connection,
built with the :class:`Edge` all connections of the process share. Each request on a connection
is one :class:`Exchange` (the ASGI ``receive``/``send`` of that request)::

    accept ─▶ data_received ─▶ httptools ─▶ on_message_begin (the ``received`` stamp)
                                         ─▶ on_url / on_header (the caps: 414, 431, 400)
                                         ─▶ on_headers_complete ─▶ gateway/intake.py's rules
                                            ─▶ Exchange ─▶ the app's task (or the edge's answer)
                                         ─▶ on_body / on_message_complete ─▶ ``receive()``

What it does, and how:

- **keep-alive** (HTTP/1.1's default, ``Connection: close`` or HTTP/1.0 ends it after the
  answer); an idle kept-alive connection is closed after ``Edge.keep_alive_s`` (5 s).
- **pipelining** (RFC 9112 §9.3): requests that arrive before the previous answer is complete
  are queued and served in order, one at a time; reading pauses while any is queued.
- **the client guards** (docs/spec.md §4 ``[server]``): a head due ``client_header_timeout_s``
  after the accept or the next request's first byte, body reads no more than
  ``client_body_timeout_s`` apart (time the gateway is not reading never counts), 408 either
  way; a head over 64 KiB or 100 headers is 431 — counted as the bytes arrive, so a field
  httptools holds until its CRLF cannot grow past it (head or trailers) —, a target over 64 KiB
  is 414, a header value holding a line break or anything httptools refuses is 400; beyond
  ``max_client_connections`` a new connection gets 503 and is closed. All in the OpenAI error
  shape, then closed.
- **the edge's rules** (docs/spec.md §25, :mod:`gateway.intake`): the canonical target in
  ``scope["path"]`` and ``scope["raw_path"]`` (one spelling), exactly one valid ``Host``, no
  ``TRACE``/``CONNECT``, the ``Origin`` policy and CORS; a refusal is answered in the request's
  place (pipelined answers keep their order) and ends the connection.
- **lingering close**: an answer given before its request's body was read ends the connection —
  ``Connection: close``, a half-close, what the client still sends dropped, aborted after
  ``linger_s`` (:class:`~gateway.intake.Lingering`) — instead of reading a body nobody will use.
- **``Expect: 100-continue``**: ``100 Continue`` goes out when the app first asks for the body
  (a request answered without reading it never gets one).
- **the ``received`` stamp** (:data:`gateway.context.RECEIVED_AT`): the read that holds a
  request's first byte, before parsing and before the app's task exists.
- **one write per answer**: a response head is held until the first body write of the same
  event-loop step and leaves with it, so a whole answer (and a stream's first event) is one
  ``write``; a head no body follows in that step goes out when the step ends. A head whose
  message says ``gateway.body_follows`` (:data:`gateway.context.BODY_FOLLOWS`, what
  ``ResponseWriter.whole`` sends) waits for its body without that end-of-step flush.
- **backpressure**: a request body over 64 KiB not yet taken by the app pauses reading;
  ``pause_writing`` from the transport makes the app's next ``send`` wait for the buffer.
- **a client that goes away**: the app's ``receive()`` gives ``http.disconnect`` (the request
  path books a 499), and its ``send`` is a no-op from then on.
- **a ``date`` header** on every answer: :attr:`Edge.date`, one encoded line the server sets
  again at each second's turn (nothing is formatted per request).
- chunked and content-length request bodies (httptools decodes them), chunked responses when
  the app sets no content-length, HEAD (the head only).

A WebSocket upgrade (``GET /v1/realtime``) is handed, with the transport and the parsed head,
to the gateway's own WebSocket protocol (``gateway/realtime/server_protocol.py``, on
``websockets``' sans-I/O one), which validates the handshake and serves the ASGI app from there.
"""

from __future__ import annotations

import asyncio
import gc
import http
import logging
import re
import time
from collections import deque
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, cast

import httptools

from gateway.context import BODY_FOLLOWS, RECEIVED_AT
from gateway.deadline import Deadline
from gateway.errors import error_body
from gateway.intake import NOTED, TWICE, Lingering, admit
from gateway.origins import OriginPolicy, cors_headers
from gateway.realtime.server_protocol import RealtimeWebSocketProtocol

log = logging.getLogger("gateway")

#: request body bytes read and not yet taken by the app beyond which reading pauses
HIGH_WATER = 65536


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The ``[server]`` guards against slow and too many clients (docs/spec.md §4)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 10_000
    #: a request head's size (request line + headers) and header count (Envoy's defaults: 60 KiB
    #: and 100; nginx's 4 x 8 KiB): beyond them, 431 and the connection is closed
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    #: a connection answered early is closed after at most this long (:class:`Lingering`)
    linger_s: float = 2.0


_frozen = False


def freeze_startup_objects() -> None:
    """``gc.freeze()`` once per process, when the first client connects (the app is built by
    then): the startup objects (modules, config, pools, the runtime) leave the collector's
    generations, so its periodic full collections stop walking them — measured at several per
    cent of the CPU under load here (more with streams, whose relay allocates per event).
    Objects are still freed by reference counting; only cycles among startup objects are never
    collected, and startup makes none that matter."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


def canned(status: bytes, code: str, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer with the OpenAI error shape, sent outside any request."""
    kind = _CANNED_TYPES.get(status[:3], "invalid_request_error")
    body = error_body(message, kind, code)
    retry = b"true" if kind == "service_unavailable" else b"false"
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n" + extra + b"connection: close\r\n"
        b"x-should-retry: " + retry + b"\r\n\r\n"
    ) + body


#: the OpenAI error type of each answer sent outside a request (the rest: invalid_request_error)
_CANNED_TYPES = {b"408": "request_timeout", b"503": "service_unavailable"}
_RETRY_1 = b"retry-after: 1\r\n"


def _too_large(limits: ClientLimits) -> bytes:
    return canned(
        b"431 Request Header Fields Too Large",
        "request_header_fields_too_large",
        f"the request head is over {limits.max_headers} headers or {limits.max_head_bytes} bytes",
    )


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}
#: what may not be in a response header's name or value (a line break would split the answer)
_BAD_NAME = re.compile(b'[\x00-\x20\x7f()<>@,;:\\[\\]={}\\\\"/?]').search
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]").search
#: the answer's headers the server reads for framing (the rest pass as they are)
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


def date_line(now: float | None = None) -> bytes:
    """The ``date`` header line of an answer (RFC 9110 §6.6.1) at ``now`` (default: now)."""
    return b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"


class Edge:
    """What every connection of one server shares (one per serving process): the app and its
    lifespan state, the client guards, the keep-alive wait, the WebSocket settings, the
    connections and request tasks the drain waits for, and the ``date`` line every answer
    carries (the server sets it again each second: nothing is computed per request)."""

    def __init__(
        self,
        app: Any,
        *,
        state: dict[str, Any] | None = None,
        limits: ClientLimits | None = None,
        keep_alive_s: float = 5.0,
        freeze_gc: bool = False,
        ws_enabled: bool = False,
        ws_max_size: int = 16 * 1024 * 1024,
        origins: OriginPolicy | None = None,
    ) -> None:
        self.app = app
        #: the lifespan state (ASGI ``scope["state"]``): each request gets a shallow copy
        self.state: dict[str, Any] = {} if state is None else state
        self.limits = limits or ClientLimits()
        #: an idle kept-alive connection is closed after this long
        self.keep_alive_s = keep_alive_s
        #: see :func:`freeze_startup_objects` (``gateway serve`` sets it)
        self.freeze_gc = freeze_gc
        #: WebSocket upgrades are served (else an upgrade is answered as plain HTTP)
        self.ws_enabled = ws_enabled
        #: a WebSocket message over this many bytes closes the session (1009)
        self.ws_max_size = ws_max_size
        #: ``[server] allowed_origins`` (docs/spec.md §25)
        self.origins = origins or OriginPolicy(None)
        #: the open connections (each has ``shutdown()``) and the running request tasks
        self.connections: set[Any] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.total_requests = 0
        self.date = date_line()


def _address(transport: asyncio.Transport, key: str) -> tuple[str, int] | None:
    info = transport.get_extra_info(key)
    if isinstance(info, tuple | list) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class Awaiting:
    """What a client connection owes the gateway next, as the guards see it::

        accept ──▶ HEAD ──head in──▶ BODY ──message complete──▶ NOTHING
                    ▲                                              │
                    └──────────── the next request's first byte ───┘

    One timer per connection serves all three (:class:`~gateway.deadline.Deadline`).
    (Plain class attributes, not an enum: they are compared per request.)
    """

    #: a request head: due ``client_header_timeout_s`` after the accept (a connection's first
    #: request) or after the request's first byte (a kept-alive connection's next one)
    HEAD = "head"
    #: the rest of the request body: no gap between two reads over ``client_body_timeout_s``
    BODY = "body"
    #: the request is read, or the connection is between requests (keep-alive watches that)
    NOTHING = "nothing"


class Exchange:
    """One request and its answer: the ASGI ``receive`` and ``send`` the app's task gets."""

    __slots__ = (
        "_flush",
        "_held",
        "_left",
        "_read_all",
        "_waiter",
        "app",
        "body",
        "chunked",
        "conn",
        "cors",
        "disconnected",
        "head_only",
        "keep_alive",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        conn: Http1Protocol,
        scope: dict[str, Any],
        keep_alive: bool,
        expect: bool,
        app: Any,
        cors: bytes | None = None,
    ) -> None:
        self.conn = conn
        self.scope = scope
        #: what answers the request: the app, or the edge's own answer (gateway/intake.py)
        self.app = app
        #: an allowed Origin: the answer carries CORS for it (docs/spec.md §25)
        self.cors = cors
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect
        self.head_only = scope["method"] == "HEAD"
        self.body = bytearray()
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        #: content-length bytes still owed (None: chunked, or none declared)
        self._left: int | None = None
        #: the response head, held for the first body write of the same step
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: the app was given the whole body: receive() waits for a disconnect from then on
        self._read_all = False

    # ------------------------------------------------------------ the connection's side

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def lost(self) -> None:
        if not self.response_complete:
            self.disconnected = True
        self.wake()

    async def run(self) -> None:
        try:
            result = await self.app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.conn.transport.close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r", result)
                self.conn.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.conn.transport.close()

    async def _send_500(self) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    # ------------------------------------------------------------ ASGI

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.waiting_for_100_continue:
            self.waiting_for_100_continue = False
            if not conn.transport.is_closing():
                conn.transport.write(_CONTINUE)
        # wait for body bytes, or (the whole body given) for the client to go or the answer
        # to be complete
        while (
            not self.disconnected
            and not self.response_complete
            and (self._read_all or (self.more_body and not self.body))
        ):
            conn.resume_reading()
            waiter = self._waiter = conn.loop.create_future()
            await waiter
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = bytes(self.body)
        self.body.clear()
        if len(body) >= HIGH_WATER:
            conn.resume_reading()
        more = self.more_body
        self._read_all = not more
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}")
            self.response_started = True
            self.waiting_for_100_continue = False
            self._start(message["status"], message.get("headers", ()))
            if not message.get(BODY_FOLLOWS):  # else the body's write takes the head along
                self._flush = conn.loop.call_soon(self._flush_head)
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"Unexpected ASGI message {kind!r}")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        self._write_body(body, more)
        if not more:
            if self._left:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.wake()
            conn.answered(self)

    def _start(self, status: int, headers: Any) -> None:
        conn = self.conn
        parts = [STATUS_LINES[status], conn.edge.date]
        if self.more_body and conn.exchange is self:
            # answered before its body was read: the connection ends with this answer
            # (:meth:`Http1Protocol.answered` lingers), never reading a body nobody will use
            self.keep_alive = False
        if self.cors is not None:
            for name, value in cors_headers(self.cors):
                parts += (name, b": ", value, b"\r\n")
        said_close = False
        length = None
        chunked = False
        for name, value in headers:
            low = name.lower()
            if low in _FRAMING:
                if low == b"content-length":
                    length = int(value)
                elif low == b"transfer-encoding":
                    chunked = value.lower() == b"chunked"
                elif b"close" in value.lower():  # connection
                    said_close = True
                    self.keep_alive = False
            parts += (low, b": ", value, b"\r\n")
        # both checks are per byte: one search over all the names and one over all the values
        # costs less than two per header
        if _BAD_NAME(b"".join([n for n, _ in headers])) or _BAD_VALUE(
            b"".join([v for _, v in headers])
        ):
            raise RuntimeError("Invalid HTTP header name or value.")
        if not self.keep_alive and not said_close:
            parts.append(b"connection: close\r\n")
        if length is None and not chunked and not self.head_only and status not in (204, 304):
            chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        self.chunked = chunked and not self.head_only
        self._left = length if not chunked and not self.head_only else None
        self._held = b"".join(parts)

    def _flush_head(self) -> None:
        held, self._held, self._flush = self._held, None, None
        transport = self.conn.transport
        if held is not None and not transport.is_closing():
            transport.write(held)

    def _write_body(self, body: bytes, more: bool) -> None:
        if self.head_only:
            data = b""
        elif self.chunked:
            data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                data += _LAST_CHUNK
        else:
            data = body
            left = self._left
            if left is not None:
                if len(body) > left:
                    raise RuntimeError("Response content longer than Content-Length")
                self._left = left - len(body)
        held = self._held
        transport = self.conn.transport
        if held is not None:
            self._held = None
            flush = self._flush
            if flush is not None:
                self._flush = None
                flush.cancel()
            if data:
                transport.writelines((held, data))
            else:
                transport.write(held)
        elif data:
            transport.write(data)


class ClientGuards(asyncio.Protocol):
    """The half of :class:`Http1Protocol` that reads a request head and watches what the
    client owes: the head's caps, the ``received`` stamp, the header and body timeouts, the
    keep-alive wait. The guards' one :class:`~gateway.deadline.Deadline` per connection times
    what the client owes (:class:`Awaiting`); its timer is armed only when a read leaves a
    request head or body unfinished (and set again only when it fires early, never per
    chunk): a request that arrives in one read costs none."""

    transport: asyncio.Transport
    limits: ClientLimits
    app_state: dict[str, Any]
    client: tuple[str, int] | None
    server: tuple[str, int] | None
    awaiting: str
    scope: dict[str, Any]
    exchange: Exchange | None
    active: Exchange | None
    read_paused: bool
    _guard: Deadline
    _idle: Deadline
    _headers: list[tuple[bytes, bytes]]
    _url: bytes
    _head_bytes: int
    _progress: int
    _quiet: int
    _expect_continue: bool
    _upgrade_to: bytes | None
    _host: bytes | None
    _noted: dict[bytes, bytes] | None
    _target: bytes
    _refusal: bytes | None

    def _no_head(self) -> None:
        """The head-reading state of a connection that has read no head yet."""
        self._headers = []
        self._url = b""
        self._head_bytes = 0
        #: counts what the parser completed (a piece of the target, a header, body bytes) ...
        self._progress = 0
        #: ... and the bytes of the reads since in which it completed nothing
        self._quiet = 0
        self._expect_continue = False
        self._upgrade_to = None
        self._host = self._noted = None
        #: the canonical target (path and query) a WebSocket handshake is handed over with
        self._target = b""
        #: the whole answer to send when a guard refused the head (else a plain 400)
        self._refusal = None

    def on_message_begin(self) -> None:
        # httptools calls this from data_received on the request's first byte: that read is the
        # Timeline's ``received`` (docs/spec.md §6), before parsing, the ASGI task and queueing
        received = time.perf_counter()
        self._url = b""
        self._head_bytes = 0
        self._expect_continue = False
        self._host = self._noted = None
        headers: list[tuple[bytes, bytes]] = []
        self._headers = headers
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "root_path": "",
            "headers": headers,
            "state": self.app_state.copy(),
            RECEIVED_AT: received,
        }
        if self.awaiting is Awaiting.NOTHING:  # a kept-alive connection's next request
            self._expect(Awaiting.HEAD)

    def on_url(self, url: bytes) -> None:
        self._progress += 1
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > self.limits.max_head_bytes:
            self._refuse_head(b"414 URI Too Long", "uri_too_long", "the request target is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.limits
        headers = self._headers
        self._progress += 1
        self._head_bytes += len(name) + len(value)
        if len(headers) >= limits.max_headers or self._head_bytes > limits.max_head_bytes:
            self._refusal = _too_large(limits)
            raise httptools.HttpParserError("the request head is too large")
        if b"\r" in value or b"\n" in value:
            # an obs-fold (RFC 9112 §5.2) or a bare CR/LF that a lenient parser let through: never
            # forwarded, where it would start a header line of its own upstream
            self._refuse_head(
                b"400 Bad Request", "invalid_header", "a header value holds a line break"
            )
        name = name.lower()
        # llhttp keeps trailing whitespace, which RFC 9110 §5.5 excludes from the value
        value = value.rstrip(b" \t")
        if name in NOTED:
            self._note(name, value)
        headers.append((name, value))

    def _note(self, name: bytes, value: bytes) -> None:
        """A header the edge reads itself (gateway/intake.py); a second ``Host`` or ``Origin``
        is remembered as :data:`~gateway.intake.TWICE` (refused)."""
        if name == b"host":
            self._host = value if self._host is None else TWICE
        elif name == b"expect":
            self._expect_continue = value.lower() == b"100-continue"
        elif name == b"upgrade":
            self._upgrade_to = value.lower()
        else:  # origin, access-control-request-*
            noted = self._noted
            if noted is None:
                noted = self._noted = {}
            noted[name] = value if name not in noted else TWICE

    def _refuse_head(self, status: bytes, code: str, message: str) -> None:
        """Stop parsing this head: :meth:`data_received` sends ``status`` and closes."""
        self._refusal = canned(status, code, message)
        raise httptools.HttpParserError(message)

    # ------------------------------------------------------------ the guards

    def _expect(self, what: str) -> None:
        """The guards' one transition: what the client owes next, from now. A timer armed for
        what it owed before is cancelled (it may be due too late for the new timeout)."""
        self.awaiting = what
        guard = self._guard
        guard.stop()
        if what is Awaiting.HEAD:
            guard.timeout = self.limits.header_timeout_s
            guard.begin()
        elif what is Awaiting.BODY:
            guard.timeout = self.limits.body_timeout_s
            guard.begin()

    def _guard_expired(self) -> None:
        """The guard's deadline passed: the client owed a head, or body bytes, that long."""
        if self.transport.is_closing():
            return
        timeout = self._guard.timeout
        if self.awaiting is Awaiting.HEAD:
            self._close_with_408(
                "client_header_timeout", f"the request head did not arrive within {timeout:g} s"
            )
            return
        exchange = self.exchange
        if exchange is None:
            return
        if self.read_paused or exchange.waiting_for_100_continue:
            self._guard.start()  # the gateway is not reading: not the client's time
            return
        self._close_with_408(
            "client_body_timeout", f"no request body bytes arrived for {timeout:g} s"
        )

    def _close_with_408(self, code: str, message: str) -> None:
        self.awaiting = Awaiting.NOTHING
        active = self.active
        if active is None or active.response_complete or not active.response_started:
            self.transport.write(canned(b"408 Request Timeout", code, message))
        # the request path sees the client go away (499); nothing else is written
        self._linger()

    def _close_with(self, answer: bytes) -> None:
        self.awaiting = Awaiting.NOTHING
        self._guard.stop()
        if not self.transport.is_closing():
            self.transport.write(answer)
            self._linger()

    def _linger(self) -> None:
        """End the connection after an answer the client may still be sending a body to:
        :class:`~gateway.intake.Lingering` takes the transport over (half-close, the rest read
        and dropped, closed within ``linger_s``), and this protocol lets go of it — the
        requests in flight see the client go away (499)."""
        transport = self.transport
        if transport.is_closing():  # the client is gone already: nothing to linger for
            return
        lingering = Lingering(transport, self.limits.linger_s)
        paused = self.read_paused
        transport.set_protocol(lingering)
        self.connection_lost(None)
        lingering.start(paused)

    def _idle_expired(self) -> None:
        """A kept-alive connection idle for the edge's ``keep_alive_s``: closed."""
        if not self.transport.is_closing() and self.awaiting is Awaiting.NOTHING:
            self.transport.close()


class Http1Protocol(ClientGuards):
    """One client connection (see the module), built by the server per accepted socket with
    the :class:`Edge` all its connections share."""

    def __init__(self, edge: Edge, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.edge = edge
        self.app = edge.app
        self.loop = loop or asyncio.get_event_loop()
        self.connections: set[Any] = edge.connections
        self.tasks: set[asyncio.Task[None]] = edge.tasks
        self.app_state = edge.state
        self.limits: ClientLimits = edge.limits
        self._freeze_gc = edge.freeze_gc
        self.ws_enabled = edge.ws_enabled
        self.ws_max_size = edge.ws_max_size
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.awaiting = Awaiting.NOTHING
        self._guard = Deadline(self.loop, self.limits.header_timeout_s, self._guard_expired)
        self._idle = Deadline(self.loop, edge.keep_alive_s, self._idle_expired)
        self.read_paused = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        #: the request being read, the one being answered, the ones read and not yet answered
        self.exchange: Exchange | None = None
        self.active: Exchange | None = None
        self.pipeline: deque[Exchange] = deque()
        self.scope: dict[str, Any] = {}
        self._no_head()

    # ------------------------------------------------------------ the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has its methods
        self.transport = transport = cast(asyncio.Transport, transport)
        self.connections.add(self)
        if self._freeze_gc:
            freeze_startup_objects()
        self.client = _address(transport, "peername")
        self.server = _address(transport, "sockname")
        limits = self.limits
        if len(self.connections) > limits.max_connections:
            message = f"the gateway holds {limits.max_connections} client connections; retry"
            transport.write(
                canned(b"503 Service Unavailable", "max_client_connections", message, _RETRY_1)
            )
            transport.close()
            return
        # a client that sends nothing at all: its head is due within the timeout of the accept
        self._expect(Awaiting.HEAD)
        self._guard.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.awaiting = Awaiting.NOTHING
        self._guard.stop()
        self._idle.stop()
        self.pipeline.clear()
        for exchange in (self.active, self.exchange):
            if exchange is not None:
                exchange.lost()
        # no cycle left through the last request (it holds the connection): reference counting
        # frees both once the app's task is done
        self.active = self.exchange = None
        self.resume_writing()

    def eof_received(self) -> None:
        pass  # the transport closes; connection_lost follows

    def data_received(self, data: bytes) -> None:
        self._idle.since = None
        progress = self._progress
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade()
            return
        except httptools.HttpParserError:
            refusal, self._refusal = self._refusal, None
            if refusal is None:
                refusal = canned(b"400 Bad Request", "invalid_request", "invalid HTTP request")
            self._close_with(refusal)
            return
        if self._progress != progress:
            self._quiet = 0
        else:
            # a whole read in which the parser completed nothing: httptools holds a header field
            # (of the head or of a chunked body's trailers) until its CRLF, so what it holds is
            # counted here, as it arrives, not only in on_header
            self._quiet += len(data)
            if self._quiet > self.limits.max_head_bytes:
                self._close_with(_too_large(self.limits))
                return
        # a read that leaves a head or a body unfinished arms the guard's timer (if it is not):
        # a request that arrives whole in one read (nearly all of them) costs no timer at all
        self._guard.arm()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.pipeline:
            self.read_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        """Until the transport's write buffer is under its low-water mark (or the client is
        gone)."""
        if self._drained is None:
            self._drained = self.loop.create_future()
        await asyncio.shield(self._drained)

    def shutdown(self) -> None:
        """The server stops (SIGTERM): an idle connection closes now, one in a request closes
        once its answer is out (requests read after it are not answered)."""
        self.pipeline.clear()
        active = self.active
        if active is None or active.response_complete:
            self.transport.close()
        else:
            active.keep_alive = False

    # ------------------------------------------------------------ httptools' callbacks

    def on_headers_complete(self) -> None:
        parser = self.parser
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        if version != "1.1":
            scope["http_version"] = version
        upgrade = parser.should_upgrade()
        # the method, the target's canonical form, Host, Origin (docs/spec.md §25)
        verdict = admit(scope, self._url, version, self._host, self._noted, self.edge.origins)
        if verdict is None or isinstance(verdict, bytes):
            if upgrade and self._upgrade_to == b"websocket" and self.ws_enabled:
                query = scope["query_string"]
                self._target = scope["raw_path"] + b"?" + query if query else scope["raw_path"]
                return  # data_received hands the connection over (HttpParserUpgrade)
            app, cors, refused = self.app, verdict, False
        else:  # the edge answers: a preflight keeps the connection, a refusal ends it
            app, cors, refused = verdict, None, verdict.status >= 400
        keep_alive = version != "1.0" and parser.should_keep_alive() and not upgrade
        keep_alive = keep_alive and not refused
        exchange = Exchange(self, scope, keep_alive, self._expect_continue, app, cors)
        self.exchange = exchange
        # a body may follow: the gaps between its reads are watched until message complete
        self._expect(Awaiting.BODY)
        active = self.active
        if active is None or active.response_complete:
            self._start(exchange)
        else:  # pipelined (RFC 9112 §9.3): answered in order, after the one in progress
            self.pipeline.append(exchange)
            self.read_paused = True
            self.transport.pause_reading()

    def on_body(self, body: bytes) -> None:
        self._progress += 1
        self._guard.touch()
        exchange = self.exchange
        if exchange is None or exchange.response_complete:
            return
        exchange.body += body
        if len(exchange.body) > HIGH_WATER:
            self.pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        self._expect(Awaiting.NOTHING)
        exchange = self.exchange
        if exchange is None:
            return
        exchange.more_body = False
        exchange.wake()
        if exchange.response_complete and not self.pipeline:
            self._idle.start()  # answered before its body was read: now idle

    # ------------------------------------------------------------ requests and answers

    def _start(self, exchange: Exchange) -> None:
        self.active = exchange
        task = self.loop.create_task(exchange.run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def answered(self, exchange: Exchange) -> None:
        """An answer is complete: the next pipelined request, or the keep-alive wait."""
        self.edge.total_requests += 1
        transport = self.transport
        if not exchange.keep_alive:
            self.pipeline.clear()
            if self.exchange is exchange and exchange.more_body:
                self._linger()  # a body is still owed: not read to its end (413, 401, ...)
            else:
                transport.close()
            return
        if transport.is_closing():
            return
        if self.pipeline:
            self._start(self.pipeline.popleft())
            self.resume_reading()
            return
        self.resume_reading()
        if (
            self.awaiting is Awaiting.NOTHING
            and self.exchange is exchange
            and not exchange.more_body
        ):
            self._idle.start()

    def _upgrade(self) -> None:
        """``HttpParserUpgrade``: a WebSocket handshake goes, with the transport, to
        :class:`~gateway.realtime.server_protocol.RealtimeWebSocketProtocol` (``websockets``
        validates it from the head parsed here); any other upgrade was served as plain HTTP and
        the connection closes after it."""
        exchange = self.exchange
        if exchange is not None and exchange.scope is self.scope:
            exchange.keep_alive = False
            return
        if not self.ws_enabled:
            return
        # the connection is the WebSocket protocol's from here on: the guards let go of it
        self._expect(Awaiting.NOTHING)
        self._idle.stop()
        self.connections.discard(self)
        protocol = RealtimeWebSocketProtocol(
            self.app, self.app_state, self.connections, self.tasks, self.loop, self.ws_max_size
        )
        protocol.connection_made(self.transport)
        self.transport.set_protocol(protocol)
        protocol.upgrade(self.scope, self._target, self._headers)


__all__ = [
    "Awaiting",
    "ClientGuards",
    "ClientLimits",
    "Exchange",
    "Http1Protocol",
    "canned",
    "freeze_startup_objects",
]
