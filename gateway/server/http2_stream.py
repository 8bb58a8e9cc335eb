"""One HTTP/2 stream: one request and its answer, the ASGI ``receive`` and ``send`` of its task.

:class:`~gateway.server.http2.Http2Protocol` opens a :class:`Stream` per request it admits
(:func:`open_stream` applies the server's rules, docs/spec.md §25, to its header list) and feeds
it the DATA the client sends; the stream gives the app that body and sends the app's answer as
HEADERS and DATA frames on the connection's ``h2`` state machine:

- **the head**: ``:status``, the app's headers lower-cased, without the connection-specific
  ones HTTP/2 forbids (RFC 9113 §8.2.2), a header name or value holding a line break refused
  as on HTTP/1.1, the ``date`` line, CORS for an allowed ``Origin``. As on HTTP/1.1 the head is
  held for the first body write of the same event-loop step (a whole answer leaves as one
  write of the connection, its HEADERS and DATA together); a stream's head goes out at the
  end of its step.
- **flow control is backpressure** (RFC 9113 §5.2): DATA never exceeds the client's window
  nor its frame size; at a zero window ``send`` waits for the client's WINDOW_UPDATE, so the
  app's relay stops reading that stream's upstream and no other; an answer that waits
  longer than ``stalled_stream_timeout_s`` is reset by the connection (its request: 499). The
  request body the client sends is acknowledged (its window opened again) only as the app
  takes it: an app that does not read holds the client at one window.
- **a client that goes away** (RST_STREAM, or the connection lost): ``receive()`` gives
  ``http.disconnect`` (the request path books a 499, cancels the upstream attempt and prices
  what was streamed), and ``send`` is a no-op from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any, Protocol

from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import H2Error

from gateway.config import Http2Config
from gateway.context import BODY_FOLLOWS
from gateway.origins import cors_headers
from gateway.server.intake import NOTED, TWICE, IntakeAnswer, admit, refusal
from gateway.server.state import ServerState

log = logging.getLogger("gateway")

__all__ = ["Http2Connection", "Stream", "open_stream"]

#: RFC 9113 §8.2.2: connection-specific fields are malformed in HTTP/2: never sent
_HOP_BY_HOP = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
_BAD_NAME = re.compile(b'[\x00-\x20\x7f()<>@,;:\\[\\]={}\\\\"/?]').search
_BAD_VALUE = re.compile(b"[\x00\x0a\x0d]").search
#: RFC 9110 §9.1: a method is a token
_METHOD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+").fullmatch
_STATUS = {code: str(code).encode() for code in range(100, 600)}
_CONTINUE = [(b":status", b"100")]


class Http2Connection(Protocol):
    """What a stream needs of its connection (:class:`~gateway.server.http2.Http2Protocol`)."""

    h2: H2Connection
    loop: asyncio.AbstractEventLoop
    server_state: ServerState
    write_paused: bool

    def flush_soon(self) -> None:
        """Write what the ``h2`` state machine holds at the end of this event-loop step."""

    def sent_data(self) -> None:
        """A DATA frame went out (each earns the client two WINDOW_UPDATEs)."""

    def watch(self) -> None:
        """A stream began to wait (for the client's body or window): the sweep looks at it."""

    async def drain(self) -> None: ...

    def answered(self, stream: Stream) -> None:
        """The answer is complete."""

    def finished(self, stream: Stream) -> None:
        """The stream's task is done: its slot is free."""


class Stream:
    """One request on a connection and its answer (see the module)."""

    __slots__ = (
        "_flush",
        "_head",
        "_read_all",
        "_waiter",
        "_window",
        "app",
        "blocked_since",
        "body",
        "conn",
        "cors",
        "disconnected",
        "head_only",
        "id",
        "last_read",
        "more_body",
        "reading",
        "response_complete",
        "response_started",
        "scope",
        "unacked",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        conn: Http2Connection,
        stream_id: int,
        scope: dict[str, Any],
        app: Any,
        cors: bytes | None,
        expect: bool,
    ) -> None:
        self.conn = conn
        self.id = stream_id
        self.scope = scope
        #: what answers the request: the app, or the server's own (gateway/server/intake.py)
        self.app = app
        self.cors = cors
        self.waiting_for_100_continue = expect
        self.head_only = scope.get("method") == "HEAD"
        self.body = bytearray()
        #: flow-controlled bytes received and not yet given to the app (acknowledged on take)
        self.unacked = 0
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        #: loop time of the last DATA (the body's gaps are timed while the app waits for it)
        self.last_read = conn.loop.time()
        #: the app waits for body bytes that have not come
        self.reading = False
        #: loop time since which ``send`` waits at a zero window (None: it does not)
        self.blocked_since: float | None = None
        self._head: list[tuple[bytes, bytes]] | None = None
        self._flush: asyncio.Handle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._window: asyncio.Future[None] | None = None
        self._read_all = False

    # ------------------------------------------------------------ the connection's side

    def received(self, data: bytes, flow: int, now: float) -> None:
        if self.response_complete or self.disconnected:
            self.conn.h2.acknowledge_received_data(flow, self.id)  # nobody will read it
            return
        self.body += data
        self.unacked += flow
        self.last_read = now
        self.wake()

    def ended(self) -> None:
        self.more_body = False
        self.wake()

    def lost(self) -> None:
        """The client reset the stream, or the connection ended."""
        if not self.response_complete:
            self.disconnected = True
        self.wake()
        self.window_opened()

    def wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def window_opened(self) -> None:
        window, self._window = self._window, None
        if window is not None and not window.done():
            window.set_result(None)

    async def run(self) -> None:
        try:
            result = await self.app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            if not self.response_started:
                await _send_500(self.send)
            else:
                self._reset(ErrorCodes.INTERNAL_ERROR)
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r", result)
                self._reset(ErrorCodes.INTERNAL_ERROR)
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await _send_500(self.send)
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._reset(ErrorCodes.INTERNAL_ERROR)
        finally:
            self.conn.finished(self)

    def _reset(self, code: ErrorCodes) -> None:
        if not self.disconnected:
            self.disconnected = True
            with contextlib.suppress(H2Error):
                self.conn.h2.reset_stream(self.id, code)
            self.conn.flush_soon()

    # ------------------------------------------------------------ ASGI

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.waiting_for_100_continue:
            self.waiting_for_100_continue = False
            if not self.response_started and not self.disconnected:
                conn.h2.send_headers(self.id, _CONTINUE)
                conn.flush_soon()
        while (
            not self.disconnected
            and not self.response_complete
            and (self._read_all or (self.more_body and not self.body))
        ):
            if not self._read_all and not self.reading:
                self.reading = True
                self.last_read = conn.loop.time()
                conn.watch()
            waiter = self._waiter = conn.loop.create_future()
            await waiter
        self.reading = False
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = bytes(self.body)
        self.body.clear()
        if self.unacked:
            conn.h2.acknowledge_received_data(self.unacked, self.id)
            self.unacked = 0
            conn.flush_soon()
        more = self.more_body
        self._read_all = not more
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            # the client does not read what its windows let through: timed as a shut window
            self.blocked_since = conn.loop.time()
            conn.watch()
            try:
                await conn.drain()
            finally:
                self.blocked_since = None
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}")
            self.response_started = True
            self.waiting_for_100_continue = False
            self._head = response_head(
                message["status"], message.get("headers", ()), conn.server_state.date, self.cors
            )
            if not message.get(BODY_FOLLOWS):  # else the body's write takes the head along
                self._flush = conn.loop.call_soon(self._flush_head)
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"Unexpected ASGI message {kind!r}")
        more = message.get("more_body", False)
        body = b"" if self.head_only else message.get("body", b"")
        try:
            await self._write(body, not more)
        except H2Error:  # the stream closed under us (reset, connection ending)
            self.disconnected = True
            return
        if not more and not self.disconnected:
            self.response_complete = True
            self.wake()
            conn.answered(self)

    def _flush_head(self) -> None:
        self._flush = None
        head, self._head = self._head, None
        if head is not None and not self.disconnected:
            try:
                self.conn.h2.send_headers(self.id, head)
            except H2Error:
                self.disconnected = True
                return
            self.conn.flush_soon()

    async def _write(self, data: bytes, end: bool) -> None:
        conn = self.conn
        h2 = conn.h2
        head = self._head
        if head is not None:
            self._head = None
            if self._flush is not None:
                self._flush.cancel()
                self._flush = None
            h2.send_headers(self.id, head, end_stream=end and not data)
            if not data:
                conn.flush_soon()
                return
        elif not data:
            if end:
                h2.end_stream(self.id)
                conn.flush_soon()
            return
        while data:
            window = h2.local_flow_control_window(self.id)
            if window <= 0:
                await self._wait_window()
                if self.disconnected:
                    return
                continue
            size = min(len(data), window, h2.max_outbound_frame_size)
            chunk, data = (data, b"") if size == len(data) else (data[:size], data[size:])
            h2.send_data(self.id, chunk, end_stream=end and not data)
            conn.sent_data()
        conn.flush_soon()

    async def _wait_window(self) -> None:
        """The client's window (the stream's or the connection's) is shut: wait for it to open
        (or for the stream to end); the connection's sweep reaps a wait that lasts."""
        conn = self.conn
        conn.flush_soon()  # what fits is out before waiting
        self.blocked_since = conn.loop.time()
        conn.watch()
        window = self._window = conn.loop.create_future()
        try:
            await window
        finally:
            self.blocked_since = None


async def _send_500(send: Any) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": b"Internal Server Error"})


def response_head(
    status: int, headers: Any, date: bytes, cors: bytes | None
) -> list[tuple[bytes, bytes]]:
    """An answer's HTTP/2 header list (see the module); ``date`` is the server's date line."""
    head = [(b":status", _STATUS[status]), (b"date", date[6:-2])]
    names = []
    values = []
    for name, value in headers:
        low = name.lower()
        if low not in _HOP_BY_HOP:
            head.append((low, value))
            names.append(low)
            values.append(value)
    # one search over all the names and one over all the values (as HTTP/1.1 does)
    if _BAD_NAME(b"".join(names)) or _BAD_VALUE(b"".join(values)):
        raise RuntimeError("Invalid HTTP header name or value.")
    if cors is not None:
        head += cors_headers(cors)
    return head


_TOO_MANY = refusal(
    431, "request_header_fields_too_large", "the request has more header fields than allowed"
)
_NO_HOST = refusal(400, "invalid_host", "an HTTP/2 request needs one :authority or Host")
_HOST_DIFFERS = refusal(400, "invalid_host", "Host and :authority name different hosts")
_BAD_METHOD = refusal(400, "invalid_request", "the :method is not a token")
_BAD_HEADER = refusal(400, "invalid_header", "a header value holds a line break or NUL")


def open_stream(
    conn: Http2Connection,
    limits: Http2Config,
    stream_id: int,
    headers: list[tuple[bytes, bytes]],
    head: dict[str, Any],
) -> Stream:
    """A stream for a request's header list (``h2`` validated it: RFC 9113 §8.3). ``head`` is
    the connection's part of the scope (``server``, ``client``, ``scheme``, the ``received``
    stamp): the server's rules (docs/spec.md §25) decide who answers, as on HTTP/1.1."""
    state = conn.server_state
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "2",
        **head,
        "root_path": "",
        "state": state.lifespan_state.copy(),
    }
    fields = _Fields(headers)
    scope["headers"] = fields.fields
    verdict: IntakeAnswer | bytes | None = _refused(scope, fields.method, limits, headers)
    if verdict is None:
        verdict = fields.host_verdict()
    if verdict is None:
        verdict = admit(scope, fields.path, "2", fields.host, fields.noted, state.origins)
    if isinstance(verdict, IntakeAnswer):
        return Stream(conn, stream_id, scope, verdict, None, False)
    return Stream(conn, stream_id, scope, state.app, verdict, fields.expect)


class _Fields:
    """A request's header list read once: the pseudo-headers, the fields the server reads
    itself (:data:`~gateway.server.intake.NOTED`), the ASGI ``headers``."""

    __slots__ = ("authority", "expect", "fields", "host", "method", "noted", "path")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.method: bytes | None = None
        self.path = b""
        self.authority: bytes | None = None
        self.host: bytes | None = None
        self.noted: dict[bytes, bytes] | None = None
        self.expect = False
        for name, value in headers:
            if name[:1] == b":":
                if name == b":method":
                    self.method = value
                elif name == b":path":
                    self.path = value
                elif name == b":authority":
                    self.authority = value
                continue  # :scheme is the connection's own (the scope's), :protocol CONNECT's
            if name in NOTED:
                self._note(name, value)
            self.fields.append((name, value))

    def _note(self, name: bytes, value: bytes) -> None:
        if name == b"host":
            self.host = value if self.host is None else TWICE
        elif name == b"expect":
            self.expect = value.lower() == b"100-continue"
        elif name != b"upgrade":  # origin, access-control-request-*
            noted = self.noted = self.noted or {}
            noted[name] = value if name not in noted else TWICE

    def host_verdict(self) -> IntakeAnswer | None:
        """``:authority`` is the host (ASGI: a ``host`` header when there is none); a ``Host``
        that names another is refused (RFC 9113 §8.3.1), as is a request naming none."""
        authority = self.authority
        if authority is not None:
            if self.host is None:
                self.fields.insert(0, (b"host", authority))
            elif self.host != authority:
                return _HOST_DIFFERS
            self.host = authority
        return _NO_HOST if self.host is None else None


def _refused(
    scope: dict[str, Any],
    method: bytes | None,
    limits: Http2Config,
    headers: list[tuple[bytes, bytes]],
) -> IntakeAnswer | None:
    """The head's own faults: too many fields (431), a method that is no token, a value with a
    line break or NUL (which ``h2`` refuses too, from 4.2 on)."""
    if method is None or not _METHOD(method):
        scope["method"] = "GET"
        return _BAD_METHOD
    scope["method"] = method.decode("ascii")
    if len(headers) > limits.max_headers:
        return _TOO_MANY
    if _BAD_VALUE(b"".join([v for _, v in headers])):
        return _BAD_HEADER
    return None
