"""The protocol an accepted connection is served by: the one place the server chooses it, once
per connection (docs/spec.md §27).

- plain TCP (no ``[server.tls]``, no ``h2c``): HTTP/1.1 (:class:`~gateway.server.http1.
  Http1Protocol`, which hands a WebSocket upgrade on to :class:`~gateway.server.websocket.
  RealtimeWebSocketProtocol`) — the factory builds it directly, nothing is looked at;
- TLS: the protocol ALPN chose in the handshake (``h2``: :class:`~gateway.server.http2.
  Http2Protocol`; ``http/1.1``, or no ALPN: HTTP/1.1 with ``scheme`` ``https``);
- ``[server] h2c = true``: a connection whose first bytes are the HTTP/2 connection preface
  (``PRI * HTTP/2.0``, RFC 9113 §3.3: prior knowledge) is HTTP/2 in clear, any other is HTTP/1.1
  (an ``Upgrade: h2c`` request is served as HTTP/1.1: RFC 9113 §3.1 retired that upgrade).

:class:`~gateway.server.process.Server` asks this module for the factory of its listening
socket, and the drain knows a connection only as :class:`~gateway.server.state.Served`
(registered in ``ServerState.connections``, answering ``shutdown()``), whichever protocol serves
it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast

from gateway.server.http1 import Http1Protocol
from gateway.server.http2 import Http2Protocol
from gateway.server.http2_guards import PREFACE
from gateway.server.state import ServerState
from gateway.server.tls import ALPN_H2


def protocol_factory(
    state: ServerState, loop: asyncio.AbstractEventLoop
) -> Callable[[], asyncio.Protocol]:
    """What ``loop.create_server`` builds per accepted socket, sharing ``state``."""
    if state.tls is None and not state.h2c:
        return lambda: Http1Protocol(state, loop)
    return lambda: Negotiated(state, loop)


class Negotiated(asyncio.Protocol):
    """A TLS or ``h2c`` connection until its protocol is known (see the module): it then hands
    the transport to that protocol and is out of the way."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.loop = loop
        self.http1: Http1Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.seen = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = self.transport = cast(asyncio.Transport, transport)
        state = self.state
        sslobj = transport.get_extra_info("ssl_object")
        if isinstance(sslobj, ssl.SSLObject | ssl.SSLSocket):  # after the handshake
            if sslobj.selected_alpn_protocol() == ALPN_H2 and state.http2 is not None:
                protocol = Http2Protocol(state, self.loop, "https")
                transport.set_protocol(protocol)
                protocol.connection_made(transport)
                return
            http1 = Http1Protocol(state, self.loop)
            http1.scheme = "https"
            transport.set_protocol(http1)
            http1.connection_made(transport)
            return
        # h2c: HTTP/1.1's guards watch the connection (its head timeout, the connection cap)
        # until the first bytes say which protocol it speaks
        self.http1 = Http1Protocol(state, self.loop)
        self.http1.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        http1, transport = self.http1, self.transport
        assert http1 is not None and transport is not None
        seen = self.seen + data
        if PREFACE.startswith(seen[: len(PREFACE)]) and not transport.is_closing():
            if len(seen) < len(PREFACE):
                self.seen = seen  # the preface so far: wait for the rest
                return
            http1.connection_lost(None)  # HTTP/1.1 lets go of it (its guards, its count)
            protocol = Http2Protocol(self.state, self.loop, "http")
            transport.set_protocol(protocol)
            protocol.connection_made(transport, seen)
            return
        self.seen = b""
        transport.set_protocol(http1)
        http1.data_received(seen)

    def eof_received(self) -> None:
        if self.http1 is not None:
            self.http1.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.http1 is not None:
            self.http1.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.http1 is not None:
            self.http1.pause_writing()

    def resume_writing(self) -> None:
        if self.http1 is not None:
            self.http1.resume_writing()


__all__ = ["Negotiated", "protocol_factory"]
