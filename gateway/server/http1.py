"""The gateway's HTTP/1.1 server protocol: an asyncio protocol on httptools serving the ASGI app.

:mod:`gateway.server.process` runs it (the lifespan, the listening socket, signals, the SIGTERM
drain; :mod:`gateway.server.supervisor` the ``--workers``): one :class:`Http1Protocol` per
accepted connection (:mod:`gateway.server.connections` picks it), built with the
:class:`~gateway.server.state.ServerState` all connections of the process share. Each request
on a connection is one :class:`~gateway.server.http1_exchange.Exchange` (the ASGI
``receive``/``send`` of that request)::

    accept ─▶ data_received ─▶ httptools ─▶ on_message_begin (the ``received`` stamp)
                                         ─▶ on_url / on_header (the caps: 414, 431, 400)
                                         ─▶ on_headers_complete ─▶ gateway/server/intake.py's
                                            rules ─▶ Exchange ─▶ the app's task (or the
                                            server's own answer)
                                         ─▶ on_body / on_message_complete ─▶ ``receive()``

The connection's parts, each in its module:

- **this module**: the transport's side (accept, reads, pauses, the drain's ``shutdown``), the
  request heads admitted, **keep-alive** (HTTP/1.1's default, ``Connection: close`` or HTTP/1.0
  ends it after the answer) and **pipelining** (RFC 9112 §9.3: requests that arrive before the
  previous answer is complete are queued and served in order, one at a time; reading pauses
  while any is queued), and the WebSocket hand-off;
- **the client guards** (:mod:`gateway.server.http1_guards`): the head read and its caps, the
  header and body timeouts, 503 beyond ``max_client_connections``, the lingering close;
- **the server's rules** (docs/spec.md §25, :mod:`gateway.server.intake`): the canonical target
  in ``scope["path"]`` and ``scope["raw_path"]`` (one spelling), exactly one valid ``Host``, no
  ``TRACE``/``CONNECT``, the ``Origin`` policy and CORS; a refusal is answered in the request's
  place (pipelined answers keep their order) and ends the connection;
- **the answer** (:mod:`gateway.server.http1_exchange`): ``100-continue``, one write per answer,
  framing, backpressure, a client that goes away, the ``date`` line.

A WebSocket upgrade (``GET /v1/realtime``) is handed, with the transport and the parsed head,
to the gateway's own WebSocket protocol (:mod:`gateway.server.websocket`, on ``websockets``'
sans-I/O one), which validates the handshake and serves the ASGI app from there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast

import httptools

from gateway.deadline import Deadline
from gateway.server.http1_exchange import HIGH_WATER, Exchange
from gateway.server.http1_guards import RETRY_1, Awaiting, ClientGuards, canned, too_large
from gateway.server.intake import admit
from gateway.server.state import (
    ClientLimits,
    Served,
    ServerState,
    WriteFlow,
    freeze_startup_objects,
)
from gateway.server.websocket import RealtimeWebSocketProtocol


def _address(transport: asyncio.Transport, key: str) -> tuple[str, int] | None:
    info = transport.get_extra_info(key)
    if isinstance(info, tuple | list) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class Http1Protocol(WriteFlow, ClientGuards):
    """One client connection (see the module), built by the server per accepted socket with
    the :class:`~gateway.server.state.ServerState` all its connections share."""

    #: the scope's ``scheme`` (a TLS connection's protocol is given ``https``)
    scheme = "http"

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.server_state = state
        self.app = state.app
        self.loop = loop or asyncio.get_event_loop()
        self.connections: set[Served] = state.connections
        self.tasks: set[asyncio.Task[None]] = state.tasks
        self.lifespan_state = state.lifespan_state
        self.limits: ClientLimits = state.limits
        self._freeze_gc = state.freeze_gc
        self.ws_enabled = state.ws_enabled
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.awaiting = Awaiting.NOTHING
        self._guard = Deadline(self.loop, self.limits.header_timeout_s, self._guard_expired)
        self._idle = Deadline(self.loop, state.keep_alive_s, self._idle_expired)
        self.read_paused = False
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
                canned(b"503 Service Unavailable", "max_client_connections", message, RETRY_1)
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
                self._close_with(too_large(self.limits))
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
        verdict = admit(
            scope, self._url, version, self._host, self._noted, self.server_state.origins
        )
        if verdict is None or isinstance(verdict, bytes):
            if upgrade and self._upgrade_to == b"websocket" and self.ws_enabled:
                query = scope["query_string"]
                self._target = scope["raw_path"] + b"?" + query if query else scope["raw_path"]
                return  # data_received hands the connection over (HttpParserUpgrade)
            app, cors, refused = self.app, verdict, False
        else:  # the server answers: a preflight keeps the connection, a refusal ends it
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
        self.server_state.total_requests += 1
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
        :class:`~gateway.server.websocket.RealtimeWebSocketProtocol` (``websockets``
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
        protocol = RealtimeWebSocketProtocol(self.server_state, self.loop)
        protocol.connection_made(self.transport)
        self.transport.set_protocol(protocol)
        protocol.upgrade(self.scope, self._target, self._headers)


__all__ = ["Http1Protocol"]
