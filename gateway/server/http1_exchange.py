"""One HTTP/1.1 request and its answer: the ASGI ``receive`` and ``send`` the app's task gets.

:class:`~gateway.server.http1.Http1Protocol` makes one :class:`Exchange` per request head it
admits and feeds it the body as httptools decodes it; the exchange gives the app that body
(``receive``) and writes the app's answer (``send``) to the connection's transport:

- **``Expect: 100-continue``**: ``100 Continue`` goes out when the app first asks for the body
  (a request answered without reading it never gets one).
- **one write per answer**: a response head is held until the first body write of the same
  event-loop step and leaves with it, so a whole answer (and a stream's first event) is one
  ``write``; a head no body follows in that step goes out when the step ends. A head whose
  message says ``gateway.body_follows`` (:data:`gateway.context.BODY_FOLLOWS`, what
  ``ResponseWriter.whole`` sends) waits for its body without that end-of-step flush.
- **framing**: content-length as the app declares it (a body longer or shorter is the app's
  error), else chunked; HEAD gets the head only, 204 and 304 no body; a header name or value
  that would split the answer (a line break) is refused.
- **backpressure**: a request body over :data:`HIGH_WATER` not yet taken by the app pauses
  reading; ``pause_writing`` from the transport makes the app's next ``send`` wait.
- **a client that goes away**: ``receive()`` gives ``http.disconnect`` (the request path books
  a 499), and ``send`` is a no-op from then on.
- **CORS** for an allowed ``Origin`` (docs/spec.md §25) and the ``date`` line
  (:attr:`ServerState.date <gateway.server.state.ServerState.date>`) on every answer.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from typing import Any, Protocol

from gateway.context import BODY_FOLLOWS
from gateway.origins import cors_headers
from gateway.server.state import ServerState

log = logging.getLogger("gateway")

#: request body bytes read and not yet taken by the app beyond which reading pauses
HIGH_WATER = 65536


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


class Http1Connection(Protocol):
    """What an exchange needs of its connection (:class:`~gateway.server.http1.Http1Protocol`)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    server_state: ServerState
    write_paused: bool
    #: the request being read (its body may still be arriving)
    exchange: Exchange | None

    def resume_reading(self) -> None: ...

    async def drain(self) -> None: ...

    def answered(self, exchange: Exchange) -> None:
        """An answer is complete: the next pipelined request, or the keep-alive wait."""


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
        conn: Http1Connection,
        scope: dict[str, Any],
        keep_alive: bool,
        expect: bool,
        app: Any,
        cors: bytes | None = None,
    ) -> None:
        self.conn = conn
        self.scope = scope
        #: what answers the request: the app, or the server's own (gateway/server/intake.py)
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
        parts = [STATUS_LINES[status], conn.server_state.date]
        if self.more_body and conn.exchange is self:
            # answered before its body was read: the connection ends with this answer
            # (:meth:`Http1Connection.answered` lingers), never reading a body nobody will use
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


__all__ = ["HIGH_WATER", "STATUS_LINES", "Exchange", "Http1Connection"]
