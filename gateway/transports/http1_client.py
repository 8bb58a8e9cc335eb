"""The gateway's HTTP/1.1 *client*: a lean pooled upstream transport on asyncio protocols and
httptools' response parser (the server side is :mod:`gateway.server.http1`).

Why not aiohttp's client: per request it builds a ClientRequest, a ClientResponse, a payload
object, a timer context and runs its signal machinery; under load that was most of the gateway's
own CPU per proxied request. This client does what a reverse proxy needs and nothing else: one
write of the request head (and a bytes body), httptools callbacks straight into a per-response
chunk queue (:mod:`.http1_client_connection`), keep-alive pooling per backend, flow control both
ways, and the socket timestamps the Timeline needs (docs/spec.md §6): when the last request byte
was handed to the socket, when the first response byte arrived, when the last did.

The pool's count of open connections is the set of connections not CLOSED: a connection joins
it when it starts connecting and leaves it once, as it enters CLOSED
(:meth:`~.http1_client_connection.UpstreamConnection.close` or the loop's ``connection_lost``). An
idle connection is closed after the backend's ``idle_timeout_s`` (nginx's upstream
``keepalive_timeout``) by one timer per pool; ``aclose`` closes every connection, idle or in use.

Never follows redirects, never decompresses, never reads proxy variables: the gateway decides.
Errors are the gateway's own (:mod:`gateway.errors`), as every transport's are.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterable
from urllib.parse import urlsplit

from gateway.config import BackendConfig
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports.base import Body
from gateway.transports.http1_client_connection import (
    ConnectionState,
    Http1ClientResponse,
    UpstreamConnection,
    UpstreamExchange,
)

__all__ = ["Http1ClientTransport"]

_ACTIVE = ConnectionState.ACTIVE
_IDLE = ConnectionState.IDLE
_CLOSED = ConnectionState.CLOSED


class Http1ClientTransport:
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
        self._conns: set[UpstreamConnection] = set()
        #: the IDLE ones, oldest first; the newest is reused first, so a surplus ages out
        self._idle: list[UpstreamConnection] = []
        #: the one timer that closes idle connections once they are idle_timeout_s old
        self._sweep: asyncio.TimerHandle | None = None
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body
    ) -> Http1ClientResponse:
        head = self._head(method, url[self._origin_len :] or "/", headers, body)
        conn, connect_at = await self._acquire()
        # the connection's loop, not asyncio.get_running_loop(): that costs a getpid() syscall
        ex = conn.exchange = UpstreamExchange(conn.loop)
        transport = conn.transport
        assert transport is not None
        try:
            # sent_at is stamped before the last write, not after it: with the
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
        return Http1ClientResponse(self, conn, ex, started_at, sent_at)

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

    async def _stream_body(self, conn: UpstreamConnection, body: AsyncIterable[bytes]) -> float:
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

    async def _acquire(self) -> tuple[UpstreamConnection, float | None]:
        idle = self._idle
        while idle:
            conn = idle.pop()
            # the upstream's FIN may have come after the loop's last poll, however long the
            # connection was idle: asked of every connection before it is reused
            if conn.reusable and not conn.peer_closed():
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
        conn = UpstreamConnection(loop, self)
        self._conns.add(conn)
        start = time.perf_counter()
        try:
            await self._connect(loop, conn)
        except BaseException:
            conn.close()
            raise
        conn.state = _ACTIVE
        return conn, start

    async def _connect(self, loop: asyncio.AbstractEventLoop, conn: UpstreamConnection) -> None:
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

    def release(self, conn: UpstreamConnection) -> None:
        """A connection back to the pool (IDLE), or closed when it cannot carry another request
        or the pool is closed."""
        conn.exchange = None
        if self._closed or not conn.reusable:
            conn.close()
            return
        conn.state = _IDLE
        conn.idle_since = now = conn.loop.time()
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_at(now + self._idle_timeout, self._close_idle)
        self._wake_one()

    def forget(self, conn: UpstreamConnection) -> None:
        """A connection entered CLOSED (once, in its ``_closed``): its place is free."""
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


def _crlf() -> UpstreamError:
    return UpstreamError(
        "refusing to send a CR or LF in a header or the target upstream", code="invalid_header"
    )
