"""One connection of the gateway's HTTP/1.1 upstream client (:mod:`.http1_client` pools them):
the asyncio protocol that httptools' response parser calls into, the exchange it fills, and the
:class:`Http1ClientResponse` the relay reads.

Two small state machines, each named (httpcore's ``HTTPConnectionState``, h11's tables)::

    connection:  CONNECTING ──▶ ACTIVE ◀──▶ IDLE          (any) ──close / lost──▶ CLOSED
    exchange:    HEAD ──head──▶ BODY ──────────────end of framing──▶ COMPLETE
                   │            BODY_UNTIL_CLOSE ──upstream closes──▶ COMPLETE
                   └──────────── (reset, bad framing, early close) ──▶ FAILED

A connection leaves the pool's count once, as it enters CLOSED (:meth:`UpstreamConnection.close`
or the loop's ``connection_lost``): it tells its pool through :meth:`ConnectionPool.forget`.
Flow control runs both ways: reading pauses above :data:`HIGH_WATER` unread body bytes and
resumes below :data:`LOW_WATER`; writing waits while the socket's buffer is full.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import select
import socket
import time
from collections.abc import AsyncIterator
from typing import Protocol, cast

import httptools

from gateway.deadline import Deadline
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.types import RawHeaders

__all__ = [
    "ConnectionPool",
    "ConnectionState",
    "ExchangeState",
    "Http1ClientResponse",
    "UpstreamConnection",
    "UpstreamExchange",
]

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class ConnectionState(enum.Enum):
    """Where a pooled connection is (the module docstring draws the transitions)."""

    CONNECTING = "connecting"  #: counted in the pool; the socket is being connected
    ACTIVE = "active"  #: carrying one exchange
    IDLE = "idle"  #: in the pool, kept alive for the next request
    CLOSED = "closed"  #: closed by either side; out of the pool's count


class ExchangeState(enum.Enum):
    """Where one request/response is, as the parser's callbacks move it."""

    HEAD = "head"  #: the answer's head is not in yet (informational 1xx answers are skipped)
    BODY = "body"  #: the head is in; Content-Length or chunked framing says where the body ends
    #: the head is in and names no length: the body ends when the upstream closes
    #: (RFC 9112 §6.3, rule 8)
    BODY_UNTIL_CLOSE = "body_until_close"
    COMPLETE = "complete"  #: the whole answer is read
    FAILED = "failed"  #: reset, bad framing or closed too early: ``error`` says which


_HEAD = ExchangeState.HEAD
_BODY = ExchangeState.BODY
_BODY_UNTIL_CLOSE = ExchangeState.BODY_UNTIL_CLOSE
_COMPLETE = ExchangeState.COMPLETE
_FAILED = ExchangeState.FAILED
_ACTIVE = ConnectionState.ACTIVE
_IDLE = ConnectionState.IDLE
_CLOSED = ConnectionState.CLOSED


class UpstreamExchange:
    """One request/response on a connection: filled by parser callbacks, read by the relay."""

    __slots__ = (
        "chunks",
        "done_at",
        "error",
        "first_byte_at",
        "framed",
        "head",
        "headers",
        "keep_alive",
        "state",
        "status",
        "unread",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.state = _HEAD
        #: resolved when the final head is in (or failed with the exchange)
        self.head: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.headers: RawHeaders = []
        #: the head being parsed has Content-Length or chunked framing
        self.framed = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.unread = 0
        self.keep_alive = False
        #: why the exchange FAILED
        self.error: UpstreamError | None = None
        #: the body reader's wait for more, while it waits
        self.waiter: asyncio.Future[None] | None = None
        self.first_byte_at: float | None = None
        self.done_at: float | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class ConnectionPool(Protocol):
    """What a connection and its response ask of the pool that holds them
    (:class:`~gateway.transports.http1_client.Http1ClientTransport`)."""

    #: seconds a wait for the upstream may last: a head, each body read
    read_timeout: float

    def release(self, conn: UpstreamConnection) -> None:
        """The exchange is over: back to the pool, or closed."""
        ...

    def forget(self, conn: UpstreamConnection) -> None:
        """The connection entered CLOSED (once): its place in the pool is free."""
        ...


#: what poll(2) reports on an idle connection that must not be reused
_PEER_SIGNS = select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR


class UpstreamConnection(asyncio.Protocol):
    """A pooled upstream connection; httptools calls the ``on_*`` methods from feed_data."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: ConnectionPool) -> None:
        self.loop = loop
        self.state = ConnectionState.CONNECTING
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: UpstreamExchange | None = None
        self.reading_paused = False
        #: loop time it went back to the pool (while IDLE)
        self.idle_since = 0.0
        #: the read timeout of every wait for the upstream (a head, then each body read): one
        #: timer for the connection's life, set again only when it fires early
        self.reading = Deadline(loop, pool.read_timeout, self._read_timed_out)
        #: when the bytes being parsed were read (data_received): the exchange's socket times
        self.read_at = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._writable: asyncio.Future[None] | None = None
        #: a poller on the socket, for the check before reuse (None: not a plain socket)
        self._poll: select.poll | None = None

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if sock is not None and sock.fileno() >= 0:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), _PEER_SIGNS)

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        # the read's time, not the parser callbacks': parsing is the gateway's work
        self.read_at = now = time.perf_counter()
        if ex.first_byte_at is None:
            ex.first_byte_at = now
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(
                UpstreamError(
                    f"upstream sent an invalid HTTP response: {exc}", code="upstream_bad_framing"
                )
            )
            self.close()

    def eof_received(self) -> bool:
        self._ended()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        self._ended(exc)
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # ------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.exchange
        assert ex is not None
        name = name.lower()
        if name == b"content-length" or (
            name == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            ex.framed = True
        ex.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational (103 Early Hints): not ours
            ex.headers = []
            ex.framed = False
            return
        ex.status = status
        ex.keep_alive = self._parser.should_keep_alive()
        ex.state = _BODY if ex.framed else _BODY_UNTIL_CLOSE
        if not ex.head.done():
            ex.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        assert ex is not None
        ex.chunks.append(body)
        ex.unread += len(body)
        if ex.unread > HIGH_WATER and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        ex.wake()

    def on_message_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        if ex.state is _HEAD:
            return  # the end of an informational response
        ex.state = _COMPLETE
        ex.done_at = self.read_at
        ex.wake()

    # ------------------------------------------------------------ helpers

    def _ended(self, exc: Exception | None = None) -> None:
        """The upstream closed (EOF) or the connection was lost."""
        ex = self.exchange
        if ex is None:
            return
        state = ex.state
        if state is _BODY_UNTIL_CLOSE:
            ex.state = _COMPLETE  # the close is the body's end
            ex.done_at = time.perf_counter()
            ex.keep_alive = False
            ex.wake()
        elif state is _HEAD:
            what, code = "upstream closed the connection", "upstream_disconnected"
            if exc is not None:
                what, code = f"upstream connection failed: {exc}", "upstream_reset"
            self._fail(UpstreamError(what, code=code))
        elif state is _BODY:
            what = "upstream response body is incomplete: the connection closed before its end"
            self._fail(UpstreamError(what, code="upstream_bad_framing"))

    def _fail(self, error: UpstreamError) -> None:
        ex = self.exchange
        if ex is None or ex.state is _COMPLETE or ex.state is _FAILED:
            return
        ex.state = _FAILED
        ex.error = error
        if not ex.head.done():
            ex.head.set_exception(error)
            ex.head.exception()  # retrieved here: the caller may have given up waiting
        ex.wake()

    def _read_timed_out(self) -> None:
        """A wait for the upstream lasted the whole read timeout: the head's, or a body read's."""
        ex = self.exchange
        if ex is not None:
            _expire(ex.head if ex.state is _HEAD else ex.waiter)

    def resume(self) -> None:
        if self.reading_paused and self.transport is not None and self.state is not _CLOSED:
            self.reading_paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        writable = self._writable
        if writable is not None:
            await writable

    def close(self) -> None:
        self._closed()
        if self.transport is not None:
            self.transport.close()

    def _closed(self) -> None:
        """The one way into CLOSED: out of the pool's count, once."""
        if self.state is not _CLOSED:
            self.state = _CLOSED
            self.reading.stop()
            self._pool.forget(self)

    @property
    def reusable(self) -> bool:
        transport = self.transport
        return self.state is not _CLOSED and transport is not None and not transport.is_closing()

    def peer_closed(self) -> bool:
        """Whether an idle connection has something the loop has not read yet: the upstream's FIN
        or RST (or bytes nobody asked for). Either way it must not carry a request: a request
        written into a connection the upstream already closed fails without an answer — a 502
        that is never retried (docs/spec.md §13: a reset after the request was sent). An
        upstream that closes right after a complete answer without ``Connection: close`` makes
        that race (the fault soak showed ~1 % of its requests); urllib3 and httpcore make the
        same check before reuse. One poll(2) with timeout 0 before each reuse: a FIN that came
        after the loop's last poll is seen only so, however long the connection was idle."""
        poller = self._poll
        return poller is not None and bool(poller.poll(0))


class Http1ClientResponse:
    """The answer of one exchange (the :class:`~gateway.transports.base.UpstreamResponse`)."""

    __slots__ = ("_conn", "_ex", "_pool", "_released", "headers", "sent_at", "started_at", "status")

    def __init__(
        self,
        pool: ConnectionPool,
        conn: UpstreamConnection,
        ex: UpstreamExchange,
        started_at: float,
        sent_at: float,
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._ex = ex
        self._released = False
        self.status = ex.status
        self.headers = ex.headers
        #: socket times (perf_counter): the attempt's start at the socket (connecting began on
        #: a new connection, else = sent_at); right before the request's last write to the socket
        self.started_at = started_at
        self.sent_at = sent_at

    @property
    def first_byte_at(self) -> float | None:
        return self._ex.first_byte_at

    @property
    def done_at(self) -> float | None:
        return self._ex.done_at

    def complete_body(self, limit: int) -> bytes | None:
        ex = self._ex
        if ex.state is not _COMPLETE or ex.unread > limit:
            return None
        chunks = ex.chunks
        body = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        ex.unread = 0
        self._conn.resume()
        return body

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        ex = self._ex
        conn = self._conn
        loop = conn.loop
        reading = conn.reading
        while True:
            while ex.chunks:
                chunk = ex.chunks.popleft()
                ex.unread -= len(chunk)
                if ex.unread < LOW_WATER:
                    conn.resume()
                yield chunk
            state = ex.state
            if state is _COMPLETE:
                return
            if state is _FAILED:
                assert ex.error is not None
                raise ex.error
            waiter = ex.waiter = loop.create_future()
            reading.start()
            try:
                await waiter
            except TimeoutError:
                conn.close()
                raise UpstreamTimeout(
                    "timed out waiting for the upstream response body",
                    code="upstream_read_timeout",
                ) from None
            finally:
                ex.waiter = None
                reading.end()

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        ex = self._ex
        if not (ex.state is _COMPLETE and ex.keep_alive and not ex.chunks):
            self._conn.close()  # unread body, or not reusable: never back to the pool
        self._pool.release(self._conn)


def _expire(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_exception(TimeoutError())
