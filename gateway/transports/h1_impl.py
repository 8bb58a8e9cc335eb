"""A lean pooled HTTP/1.1 upstream client on asyncio protocols and httptools' response parser.

Why not aiohttp's client (the previous hot path): per request it builds a ClientRequest, a
ClientResponse, a payload object, a timer context and runs its signal machinery; measured
under load here that was most of the gateway's own CPU per proxied request. This client does
what a reverse proxy needs and nothing else: one write of the request head (and a bytes body),
httptools callbacks straight into a per-response chunk queue, keep-alive pooling per backend,
flow control both ways, and the socket timestamps the Timeline needs (docs/spec.md §6): when
the last request byte was handed to the socket, when the first response byte arrived, when the
last did.

Two small state machines, each named (httpcore's ``HTTPConnectionState``, h11's tables)::

    connection:  CONNECTING ──▶ ACTIVE ◀──▶ IDLE          (any) ──close / lost──▶ CLOSED
    exchange:    HEAD ──head──▶ BODY ──────────────end of framing──▶ COMPLETE
                   │            BODY_UNTIL_CLOSE ──upstream closes──▶ COMPLETE
                   └──────────── (reset, bad framing, early close) ──▶ FAILED

The pool's count of open connections is the set of connections not CLOSED: a connection joins
it when it starts connecting and leaves it once, as it enters CLOSED (:meth:`_Connection.close`
or the loop's ``connection_lost``). An idle connection is closed after the backend's
``idle_timeout_s`` (nginx's upstream ``keepalive_timeout``) by one timer per pool; ``aclose``
closes every connection, idle or in use.

Never follows redirects, never decompresses, never reads proxy variables: the gateway decides.
Errors are the gateway's own (:mod:`gateway.errors`), as every transport's are.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import select
import socket
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.config import BackendConfig
from gateway.deadline import Deadline
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports.base import Body
from gateway.types import RawHeaders

#: pause reading from the upstream above this many unread body bytes, resume below LOW
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


class _Exchange:
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


#: what poll(2) reports on an idle connection that must not be reused
_PEER_SIGNS = select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR


class _Connection(asyncio.Protocol):
    """A pooled upstream connection; httptools calls the ``on_*`` methods from feed_data."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: H1Transport) -> None:
        self.loop = loop
        self.state = ConnectionState.CONNECTING
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.reading_paused = False
        #: loop time it went back to the pool (while IDLE)
        self.idle_since = 0.0
        #: the pool's epoch when it went back (see :meth:`H1Transport.release`)
        self.released_in = 0
        #: the read timeout of every wait for the upstream (a head, then each body read): one
        #: timer for the connection's life, set again only when it fires early (issue 15)
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
            self._pool._forget(self)

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
        same check before reuse. One poll(2) with timeout 0 — asked only for a connection the
        loop has not polled since it went idle (:meth:`H1Transport.release`)."""
        poller = self._poll
        return poller is not None and bool(poller.poll(0))


class H1Response:
    """The answer of one exchange (the :class:`~gateway.transports.base.UpstreamResponse`)."""

    __slots__ = ("_conn", "_ex", "_pool", "_released", "headers", "sent_at", "started_at", "status")

    def __init__(
        self, pool: H1Transport, conn: _Connection, ex: _Exchange, started_at: float, sent_at: float
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


def _crlf() -> UpstreamError:
    return UpstreamError(
        "refusing to send a CR or LF in a header or the target upstream", code="invalid_header"
    )


class H1Transport:
    """One pool of keep-alive connections to one backend (made once, in the lifespan)."""

    def __init__(self, backend: BackendConfig) -> None:
        parts = urlsplit(backend.url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._tls else 80)
        default_port = self._port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if default_port else f"{host}:{self._port}"
        self._origin_len = len(f"{parts.scheme}://{parts.netloc}")
        self._ssl: ssl.SSLContext | None = None
        if self._tls:
            self._ssl = ssl.create_default_context()
            self._ssl.set_alpn_protocols(["http/1.1"])
        self._connect_timeout = backend.connect_timeout_s
        self.read_timeout = backend.read_timeout_s
        self._idle_timeout = backend.idle_timeout_s
        self._limit = backend.max_connections
        #: every connection not CLOSED (connecting, active, idle): the pool's one count
        self._conns: set[_Connection] = set()
        #: the IDLE ones, oldest first; the newest is reused first, so a surplus ages out
        self._idle: list[_Connection] = []
        #: the one timer that closes idle connections once they are idle_timeout_s old
        self._sweep: asyncio.TimerHandle | None = None
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        #: counts the loop's turns in which connections went idle (:meth:`release`)
        self._epoch = 0
        self._ticking = False

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body
    ) -> H1Response:
        head = self._head(method, url[self._origin_len :] or "/", headers, body)
        conn, connect_at = await self._acquire()
        # the connection's loop, not asyncio.get_running_loop(): that costs a getpid() syscall
        ex = conn.exchange = _Exchange(conn.loop)
        transport = conn.transport
        assert transport is not None
        try:
            # sent_at is stamped before the last write, not after it (issue 32): with the
            # upstream on the same host the write wakes it, and the scheduler may run its whole
            # handler before this process resumes — a stamp taken after the write would book
            # the upstream's work as the gateway's overhead
            if body is None or isinstance(body, bytes):
                sent_at = time.perf_counter()
                transport.write(head + body if body else head)
            else:
                transport.write(head)
                sent_at = await self._stream_body(conn, body)
            reading = conn.reading
            reading.start()
            try:
                await ex.head
            finally:
                reading.end()
        except TimeoutError:
            conn.close()
            self.release(conn)
            raise UpstreamTimeout(
                "timed out waiting for the upstream's response headers",
                code="upstream_read_timeout",
            ) from None
        except BaseException:
            conn.close()
            self.release(conn)
            raise
        started_at = sent_at if connect_at is None else connect_at
        return H1Response(self, conn, ex, started_at, sent_at)

    def _head(self, method: str, target: str, headers: list[tuple[str, str]], body: Body) -> bytes:
        lines = [f"{method} {target} HTTP/1.1\r\nhost: {self._host_header}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers]
        if isinstance(body, bytes):
            lines.append(f"content-length: {len(body)}\r\n")
        elif body is not None:
            lines.append("transfer-encoding: chunked\r\n")
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("content-length: 0\r\n")
        lines.append("\r\n")
        head = "".join(lines)
        # every line holds exactly one CRLF of ours (the first two): one more CR or LF anywhere
        # is an injection (defence in depth: the server never hands us CR/LF in a header)
        n = len(lines) + 1
        if head.count("\n") != n or head.count("\r") != n:
            raise _crlf()
        return head.encode("latin-1")

    async def _stream_body(self, conn: _Connection, body: AsyncIterable[bytes]) -> float:
        """Write a body chunked; the time right before its last write (the terminator)."""
        transport = conn.transport
        assert transport is not None
        async for chunk in body:
            if chunk:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await conn.drain()
            if conn.state is _CLOSED:
                raise UpstreamError("upstream closed the connection", code="upstream_disconnected")
        sent_at = time.perf_counter()
        transport.write(b"0\r\n\r\n")
        return sent_at

    # ------------------------------------------------------------ the pool

    async def _acquire(self) -> tuple[_Connection, float | None]:
        idle = self._idle
        while idle:
            conn = idle.pop()
            # a connection the loop polled since it went idle had its FIN read by then (it is
            # CLOSED, not reusable); only one released in this very epoch needs the syscall
            if conn.reusable and (conn.released_in != self._epoch or not conn.peer_closed()):
                conn.state = _ACTIVE
                return conn, None
            conn.close()
        while len(self._conns) >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                async with asyncio.timeout(self.read_timeout):
                    await waiter
            except TimeoutError:
                raise UpstreamTimeout(
                    f"no free upstream connection within {self.read_timeout:g} s "
                    f"(max_connections = {self._limit})",
                    code="upstream_pool_timeout",
                    request_sent=False,
                ) from None
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            if idle:
                return await self._acquire()
        if self._closed:
            raise UpstreamConnectError("the upstream pool is closed: the gateway is stopping")
        loop = asyncio.get_running_loop()
        conn = _Connection(loop, self)
        self._conns.add(conn)
        start = time.perf_counter()
        try:
            await self._connect(loop, conn)
        except BaseException:
            conn.close()
            raise
        conn.state = _ACTIVE
        return conn, start

    async def _connect(self, loop: asyncio.AbstractEventLoop, conn: _Connection) -> None:
        try:
            async with asyncio.timeout(self._connect_timeout):
                await loop.create_connection(
                    lambda: conn,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise UpstreamTimeout(
                "timed out connecting to the upstream",
                code="upstream_connect_timeout",
                request_sent=False,
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise UpstreamConnectError(f"cannot connect to the upstream: {exc}") from exc

    def release(self, conn: _Connection) -> None:
        """A connection back to the pool (IDLE), or closed when it cannot carry another request
        or the pool is closed."""
        conn.exchange = None
        if self._closed or not conn.reusable:
            conn.close()
            return
        conn.state = _IDLE
        conn.idle_since = now = conn.loop.time()
        conn.released_in = self._epoch
        if not self._ticking:
            # the epoch ends at the next turn of the loop, after the I/O poll in between: what
            # the upstream sent before that poll (a FIN) has been read by then, with no syscall
            # of ours. One callback per turn for all the connections released in it.
            self._ticking = True
            conn.loop.call_soon(self._tick)
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_at(now + self._idle_timeout, self._close_idle)
        self._wake_one()

    def _tick(self) -> None:
        self._ticking = False
        self._epoch += 1

    def _forget(self, conn: _Connection) -> None:
        """A connection entered CLOSED (:meth:`_Connection._closed`, once): its place is free."""
        self._conns.discard(conn)
        self._wake_one()

    def _close_idle(self) -> None:
        """The idle timeout: close the connections idle for ``idle_timeout_s`` (the oldest are
        first in the list) and set the timer again for the oldest one left."""
        self._sweep = None
        idle = self._idle
        if not idle:
            return
        loop = idle[0].loop
        cutoff = loop.time() - self._idle_timeout
        n = 0
        for conn in idle:
            if conn.idle_since > cutoff:
                break
            n += 1
        expired = idle[:n]
        del idle[:n]
        for conn in expired:
            conn.close()
        if idle:
            self._sweep = loop.call_at(idle[0].idle_since + self._idle_timeout, self._close_idle)

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close every connection, idle or still in use (the runtime's shutdown, after the
        drain); a response released later finds its connection closed."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._idle.clear()
        for conn in list(self._conns):
            conn.close()
