"""The client guards of an HTTP/1.1 connection: what the client owes, the head's caps, the
timeouts, and the answers sent outside any request (docs/spec.md §4 ``[server]``, §25).

:class:`ClientGuards` is the half of :class:`~gateway.server.http1.Http1Protocol` that reads a
request head (httptools' ``on_message_begin``, ``on_url``, ``on_header``) and watches the client:

- a head due ``client_header_timeout_s`` after the accept or the next request's first byte, body
  reads no more than ``client_body_timeout_s`` apart (time the gateway is not reading never
  counts), 408 either way (:class:`Awaiting` is what the client owes);
- a head over 64 KiB or 100 headers is 431 — counted as the bytes arrive, so a field httptools
  holds until its CRLF cannot grow past it (head or trailers; the protocol counts the reads in
  which the parser completed nothing) —, a target over 64 KiB is 414, a header value holding a
  line break or anything httptools refuses is 400; beyond ``max_client_connections`` a new
  connection gets 503 and is closed. All in the OpenAI error shape (:func:`canned`), then closed;
- the ``received`` stamp (:data:`gateway.context.RECEIVED_AT`): the read that holds a request's
  first byte, before parsing and before the app's task exists;
- an idle kept-alive connection is closed after ``ServerState.keep_alive_s``;
- **lingering close**: an answer given before its request's body was read ends the connection —
  ``Connection: close``, a half-close, what the client still sends dropped, aborted after
  ``linger_s`` (:class:`~gateway.server.intake.Lingering`) — instead of reading a body nobody
  will use.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httptools

from gateway.context import RECEIVED_AT
from gateway.deadline import Deadline
from gateway.errors import error_body
from gateway.server.http1_exchange import Exchange
from gateway.server.intake import NOTED, TWICE, Lingering
from gateway.server.state import ClientLimits


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
#: what a 503 beyond ``max_client_connections`` asks the client to wait
RETRY_1 = b"retry-after: 1\r\n"


def too_large(limits: ClientLimits) -> bytes:
    """The 431 of a head over ``limits`` (its size or its header count)."""
    return canned(
        b"431 Request Header Fields Too Large",
        "request_header_fields_too_large",
        f"the request head is over {limits.max_headers} headers or {limits.max_head_bytes} bytes",
    )


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


class ClientGuards(asyncio.Protocol):
    """The half of :class:`~gateway.server.http1.Http1Protocol` that reads a request head and
    watches what the client owes: the head's caps, the ``received`` stamp, the header and body
    timeouts, the keep-alive wait. The guards' one :class:`~gateway.deadline.Deadline` per
    connection times what the client owes (:class:`Awaiting`); its timer is armed only when a
    read leaves a request head or body unfinished (and set again only when it fires early,
    never per chunk): a request that arrives in one read costs none."""

    transport: asyncio.Transport
    #: ``http``, or ``https`` on a TLS connection (:mod:`gateway.server.connections`)
    scheme: str
    limits: ClientLimits
    lifespan_state: dict[str, Any]
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
            "scheme": self.scheme,
            "root_path": "",
            "headers": headers,
            "state": self.lifespan_state.copy(),
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
            self._refusal = too_large(limits)
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
        """A header the server reads itself (gateway/server/intake.py); a second ``Host`` or
        ``Origin`` is remembered as :data:`~gateway.server.intake.TWICE` (refused)."""
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
        :class:`~gateway.server.intake.Lingering` takes the transport over (half-close, the
        rest read and dropped, closed within ``linger_s``), and this protocol lets go of it —
        the requests in flight see the client go away (499)."""
        transport = self.transport
        if transport.is_closing():  # the client is gone already: nothing to linger for
            return
        lingering = Lingering(transport, self.limits.linger_s)
        paused = self.read_paused
        transport.set_protocol(lingering)
        self.connection_lost(None)
        lingering.start(paused)

    def _idle_expired(self) -> None:
        """A kept-alive connection idle for the server's ``keep_alive_s``: closed."""
        if not self.transport.is_closing() and self.awaiting is Awaiting.NOTHING:
            self.transport.close()


__all__ = ["RETRY_1", "Awaiting", "ClientGuards", "canned", "too_large"]
