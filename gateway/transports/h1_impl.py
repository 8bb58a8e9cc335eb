"""A lean pooled HTTP/1.1 upstream client on asyncio protocols and httptools' response parser.

Why not aiohttp's client (the previous hot path): per request it builds a ClientRequest, a
ClientResponse, a payload object, a timer context and runs its signal machinery; measured
under load here that was most of the gateway's own CPU per proxied request. This client does
what a reverse proxy needs and nothing else: one write of the request head (and a bytes body),
httptools callbacks straight into a per-response chunk queue, keep-alive pooling per backend,
flow control both ways, and the socket timestamps the Timeline needs (SPEC §6): when the last
request byte was handed to the socket, when the first response byte arrived, when the last did.

Never follows redirects, never decompresses, never reads proxy variables: the gateway decides.
Errors are the gateway's own (:mod:`gateway.errors`), as every transport's are.
"""

from __future__ import annotations

import asyncio
import collections
import select
import socket
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.config import BackendConfig
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports.base import Body
from gateway.types import RawHeaders

#: pause reading from the upstream above this many unread body bytes, resume below LOW
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class _Exchange:
    """One request/response on a connection: filled by parser callbacks, read by the relay."""

    __slots__ = (
        "chunks",
        "complete",
        "done_at",
        "error",
        "first_byte_at",
        "head",
        "headers",
        "keep_alive",
        "length_known",
        "status",
        "unread",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.headers: RawHeaders = []
        self.chunks: collections.deque[bytes] = collections.deque()
        self.unread = 0
        self.complete = False
        self.keep_alive = False
        #: Content-Length or chunked: the end is known; otherwise the body ends at close
        self.length_known = False
        self.error: UpstreamError | None = None
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

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reading_paused = False
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
        self.closed = True
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
            ex.length_known = True
        ex.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational (103 Early Hints): not ours
            ex.headers = []
            ex.length_known = False
            return
        ex.status = status
        ex.keep_alive = self._parser.should_keep_alive()
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
        if ex.status == 0:
            return  # the end of an informational response
        ex.complete = True
        ex.done_at = self.read_at
        ex.wake()

    # ------------------------------------------------------------ helpers

    def _ended(self, exc: Exception | None = None) -> None:
        ex = self.exchange
        if ex is None or ex.complete:
            return
        if ex.head.done() and not ex.length_known and ex.status:
            ex.complete = True  # a body delimited by the close (RFC 9112 §6.3, rule 8)
            ex.done_at = time.perf_counter()
            ex.keep_alive = False
            ex.wake()
            return
        if not ex.head.done():
            what, code = "upstream closed the connection", "upstream_disconnected"
            if exc is not None:
                what, code = f"upstream connection failed: {exc}", "upstream_reset"
        else:
            what = "upstream response body is incomplete: the connection closed before its end"
            code = "upstream_bad_framing"
        self._fail(UpstreamError(what, code=code))

    def _fail(self, error: UpstreamError) -> None:
        ex = self.exchange
        if ex is None or ex.complete:
            return
        ex.error = error
        if not ex.head.done():
            ex.head.set_exception(error)
            ex.head.exception()  # retrieved here: the caller may have given up waiting
        ex.wake()

    def resume(self) -> None:
        if self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        writable = self._writable
        if writable is not None:
            await writable

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def peer_closed(self) -> bool:
        """Whether an idle connection has something the loop has not read yet: the upstream's FIN
        or RST (or bytes nobody asked for). Either way it must not carry a request: a request
        written into a connection the upstream already closed fails without an answer — a 502
        that is never retried (SPEC §13: a reset after the request was sent). An upstream that
        closes right after a complete answer without ``Connection: close`` makes that race
        (the fault soak showed ~1 % of its requests); urllib3 and httpcore make the same check
        before reuse. One poll(2) with timeout 0 per reuse."""
        poller = self._poll
        return poller is not None and bool(poller.poll(0))


class H1Response:
    """The answer of one exchange (the :class:`~gateway.transports.base.UpstreamResponse`)."""

    __slots__ = (
        "_conn",
        "_ex",
        "_pool",
        "_read_timeout",
        "_released",
        "_timer",
        "_wait_since",
        "headers",
        "sent_at",
        "started_at",
        "status",
    )

    def __init__(
        self,
        pool: H1Transport,
        conn: _Connection,
        ex: _Exchange,
        started_at: float,
        sent_at: float,
        read_timeout: float,
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._ex = ex
        self._read_timeout = read_timeout
        self._released = False
        self._timer: asyncio.TimerHandle | None = None
        self._wait_since: float | None = None
        self.status = ex.status
        self.headers = ex.headers
        #: socket times (perf_counter): the attempt's start at the socket (connecting began on
        #: a new connection, else = sent_at); the request's last byte handed to the socket
        self.started_at = started_at
        self.sent_at = sent_at

    @property
    def first_byte_at(self) -> float | None:
        return self._ex.first_byte_at

    @property
    def done_at(self) -> float | None:
        return self._ex.done_at

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        ex = self._ex
        conn = self._conn
        loop = conn.loop
        try:
            while True:
                while ex.chunks:
                    chunk = ex.chunks.popleft()
                    ex.unread -= len(chunk)
                    if ex.unread < LOW_WATER:
                        conn.resume()
                    yield chunk
                if ex.complete:
                    return
                if ex.error is not None:
                    raise ex.error
                waiter = ex.waiter = loop.create_future()
                self._wait_since = now = loop.time()
                if self._timer is None:
                    self._timer = loop.call_at(now + self._read_timeout, self._check_read)
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
                    self._wait_since = None
        finally:
            self._stop_timer()

    def _check_read(self) -> None:
        """The read timeout as one timer per response (not one per wait, i.e. per chunk of a
        stream): fired early, it is set again for the wait in progress; a wait that has lasted
        the whole timeout fails (:func:`_expire`)."""
        self._timer = None
        since = self._wait_since
        if since is None:
            return  # not waiting now: the next wait arms it again
        loop = self._conn.loop
        due = since + self._read_timeout
        if loop.time() < due:
            self._timer = loop.call_at(due, self._check_read)
            return
        waiter = self._ex.waiter
        if waiter is not None:
            _expire(waiter)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        self._stop_timer()
        ex = self._ex
        if not (ex.complete and ex.keep_alive and ex.error is None and not ex.chunks):
            self._conn.close()  # unread body, or not reusable: never back to the pool
        self._pool.release(self._conn)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
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
        self._read_timeout = backend.read_timeout_s
        self._limit = backend.max_connections
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body
    ) -> H1Response:
        head = self._head(method, url[self._origin_len :] or "/", headers, body)
        conn, connect_at = await self._acquire()
        # the connection's loop, not asyncio.get_running_loop(): that costs a getpid() syscall
        loop = conn.loop
        ex = conn.exchange = _Exchange(loop)
        transport = conn.transport
        assert transport is not None
        try:
            if body is None or isinstance(body, bytes):
                transport.write(head + body if body else head)
            else:
                transport.write(head)
                await self._stream_body(conn, body)
            sent_at = time.perf_counter()
            # a timer handle, not asyncio.timeout(): one per request, measured cheaper
            timer = loop.call_later(self._read_timeout, _expire, ex.head)
            try:
                await ex.head
            finally:
                timer.cancel()
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
        return H1Response(self, conn, ex, started_at, sent_at, self._read_timeout)

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

    async def _stream_body(self, conn: _Connection, body: AsyncIterable[bytes]) -> None:
        transport = conn.transport
        assert transport is not None
        async for chunk in body:
            if chunk:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await conn.drain()
            if conn.closed:
                raise UpstreamError("upstream closed the connection", code="upstream_disconnected")
        transport.write(b"0\r\n\r\n")

    # ------------------------------------------------------------ the pool

    async def _acquire(self) -> tuple[_Connection, float | None]:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and not conn.peer_closed():
                return conn, None
            conn.close()
            self._open -= 1
        while self._open >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                async with asyncio.timeout(self._read_timeout):
                    await waiter
            except TimeoutError:
                raise UpstreamTimeout(
                    f"no free upstream connection within {self._read_timeout:g} s "
                    f"(max_connections = {self._limit})",
                    code="upstream_pool_timeout",
                    request_sent=False,
                ) from None
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            if self._idle:
                return await self._acquire()
        self._open += 1
        start = time.perf_counter()
        try:
            return await self._connect(), start
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
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
        return conn

    def release(self, conn: _Connection) -> None:
        """A connection back to the pool (or counted out, when it is closed)."""
        conn.exchange = None
        if conn.reusable and not self._closed:
            self._idle.append(conn)
        else:
            self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._open -= len(self._idle)
        self._idle.clear()
