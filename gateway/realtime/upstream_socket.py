"""The upstream side of a realtime session: its socket (docs/spec.md §19).

:class:`UpstreamSocket` is what the relay (:mod:`gateway.realtime.message_relay`) reads and
writes; two implementations:

- :class:`WebSocketsSocket` (here): an asyncio protocol of ours over ``websockets``' public
  sans-I/O client, ``ClientProtocol`` (a maintained library: the handshake's request and
  checks, framing, masking, the answers to pings and the closing handshake are its work; the
  socket, the queue, flow control, keepalive pings and timeouts are ours). No per-message
  deflate; what URL and headers it opens with is the handshake's
  (:mod:`gateway.realtime.handshake`).
- :class:`MockSocket`: ``mock://`` backends, in process
  (:mod:`gateway.mock.realtime`), so the embedded default answers realtime sessions without
  any server.

Both raise :class:`Closed` from :meth:`recv` / :meth:`send` once the connection is over, with
the close code and reason that concern the client: the upstream's close frame when it closed
first; ours when this side failed it (a message over ``max_message_bytes`` → 1009, a
keepalive ping unanswered → 1011); and ``lost`` when the connection ended without any close
frame (the client then gets 1011).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidMessage
from websockets.frames import Frame
from websockets.http11 import Response
from websockets.protocol import OPEN
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from gateway.mock.engine import MockSettings
from gateway.mock.realtime import MockRealtime
from gateway.realtime.client_end import Take
from gateway.realtime.frames import BINARY, CONT, PONG, TEXT, Reassembly

Message = str | bytes
#: the status of an upstream WebSocket whose handshake succeeded (101 Switching Protocols)
SWITCHED = 101

#: incoming messages buffered from the upstream before reading from its socket pauses (each
#: at most ``max_message_bytes``): a slow client slows the upstream instead of growing memory
UPSTREAM_QUEUE = 4
#: a closing handshake the other end does not finish within this is cut (docs/spec.md §19:
#: the client gone, the upstream connection is closed within 1 s)
CLOSE_TIMEOUT_S = 0.9
#: keepalive pings on the upstream hop (uvicorn pings the client's hop the same way)
PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
#: the upstream socket's write buffer: writes wait (the direct path declines) above this, as
#: ``websockets``' own client does by default
WRITE_LIMIT = 32 * 1024
#: request headers that belong to the client's own WebSocket handshake: the upstream handshake


class Closed(Exception):
    """The upstream connection is over: what the client's close should say."""

    def __init__(self, code: int, reason: str, lost: bool = False) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason
        #: it ended without a close frame either way (the client gets 1011)
        self.lost = lost


class UpstreamSocket(Protocol):
    #: the subprotocol the upstream selected (None: none)
    subprotocol: str | None

    @property
    def status(self) -> int:
        """The handshake's status: :data:`SWITCHED` (the attempt loop reads an answer's)."""
        ...

    @property
    def read_at(self) -> float:
        """``time.perf_counter()`` of the socket read that delivered the last message."""
        ...

    async def recv(self) -> Message: ...

    async def send(self, data: bytes, text: bool) -> None:
        """One message (UTF-8 ``data`` when ``text``)."""
        ...

    def relayed(self) -> None:
        """The relay wrote a message :meth:`recv` gave it."""
        ...

    async def close(self, code: int, reason: str) -> None: ...


# ---------------------------------------------------------------- websockets


class _Connection(asyncio.Protocol):
    """The I/O around ``websockets``' sans-I/O client that is not per message: the transport's
    callbacks, flow control, the connection's end, the handshake's outcome and keepalive pings
    (:class:`WebSocketsSocket` adds reading and writing messages)."""

    def __init__(self, protocol: ClientProtocol) -> None:
        loop = asyncio.get_running_loop()
        self.protocol = protocol
        self.subprotocol: str | None = None
        #: ``time.perf_counter()`` of the socket read that delivered the last message
        self.read_at = 0.0
        #: the direct path's taker (None: every message goes to recv())
        self.relay: Take | None = None
        self.queued = 0
        self.transport: asyncio.Transport | None = None
        #: the handshake's outcome: the 101 response checked, or its failure
        self.opened: asyncio.Future[None] = loop.create_future()
        #: the TCP connection is gone (connection_lost)
        self.lost: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._messages: deque[tuple[bytes, bool]] = deque()
        self._fragments = Reassembly()
        self._reading_paused = False
        #: the transport's write buffer is over its high-water mark
        self._paused = False
        self._recv_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._ping: bytes | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._cut: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport.set_write_buffer_limits(WRITE_LIMIT)
        self.transport = transport

    def eof_received(self) -> bool | None:
        # a refused handshake's body may end at EOF (no Content-Length)
        protocol = self.protocol
        protocol.receive_eof()
        events = protocol.events_received()
        self._flush()
        if any(isinstance(event, Response) for event in events):
            self._response()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the state is CLOSED from here on
        for handle in (self._keepalive, self._cut):
            if handle is not None:
                handle.cancel()
        if not self.opened.done():
            failure = self.protocol.handshake_exc or InvalidMessage(
                "the connection closed during the handshake"
            )
            self.opened.set_exception(failure)
            self.opened.exception()  # retrieved: whoever awaits it raises it
        self.lost.set_result(None)
        self._paused = False
        self._wake()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------ the connection's end

    def _flush(self) -> None:
        transport = self.transport
        if transport is None:
            return
        for chunk in self.protocol.data_to_send():
            if chunk:
                transport.write(chunk)
            elif transport.can_write_eof():  # the protocol's end of stream: half-close
                with contextlib.suppress(OSError, RuntimeError):
                    transport.write_eof()
            else:
                transport.close()

    def _expect_close(self) -> None:
        """A close frame went out or came in: the upstream closes the TCP connection, or it is
        cut after :data:`CLOSE_TIMEOUT_S`."""
        if self._cut is None and not self.lost.done():
            self._cut = self._loop.call_later(CLOSE_TIMEOUT_S, self._abort)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, code: int, reason: str) -> None:
        self.protocol.fail(code, reason)
        self._flush()
        self._expect_close()

    async def _ended(self) -> None:
        """Wait for the TCP connection to end (cut after :data:`CLOSE_TIMEOUT_S` at most)."""
        if not self.lost.done():
            self._expect_close()
            await asyncio.shield(self.lost)

    def _closed(self) -> Closed:
        return _closed(self.protocol.close_exc)

    def _wake(self) -> None:
        for waiter in (self._recv_waiter, self._drain_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------ handshake and keepalive

    def _response(self) -> None:
        if self.opened.done():
            return
        failure = self.protocol.handshake_exc
        if failure is not None:
            self.opened.set_exception(failure)
            self.opened.exception()  # retrieved: whoever awaits it raises it
            return
        self.subprotocol = self.protocol.subprotocol
        self.opened.set_result(None)
        self._keepalive = self._loop.call_later(PING_INTERVAL_S, self._send_ping)

    def _send_ping(self) -> None:
        protocol = self.protocol
        if protocol.state is not OPEN:
            return
        self._ping = os.urandom(4)
        protocol.send_ping(self._ping)
        self._flush()
        self._keepalive = self._loop.call_later(PING_TIMEOUT_S, self._ping_timeout)

    def _pong(self) -> None:
        self._ping = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._keepalive = self._loop.call_later(PING_INTERVAL_S, self._send_ping)

    def _ping_timeout(self) -> None:
        if self.protocol.state is OPEN:
            self._fail(1011, "keepalive ping timeout")


class WebSocketsSocket(_Connection):
    """The upstream connection: an asyncio protocol of our own over ``websockets``' public
    sans-I/O client (:class:`websockets.client.ClientProtocol`), which does the framing,
    masking, the handshake's checks, the answers to pings and the closing handshake; this class
    does the I/O around it, as the docs' "integrate the Sans-I/O layer" describes.

    Per socket read (:meth:`data_received`): the time of the read (:attr:`read_at`), then each
    whole message (a fragmented one once its last frame is in) is offered to the relay while
    one is attached (:meth:`attach`) and nothing read before it is still queued; the relay writes
    it to the client at once or declines (the client's write buffer is full, the client is
    closing), and then the message is queued for :meth:`recv`. Reading from the socket pauses
    while :data:`UPSTREAM_QUEUE` messages are queued (the bounded queue that slows the upstream)
    and resumes once :meth:`recv` has taken all but one. :attr:`queued` counts the messages
    queued or handed to :meth:`recv` that the relay has not written yet (it calls
    :meth:`relayed` after each), so a message is never written before one read earlier.

    Writes: :meth:`write` (the direct path) writes one message as one frame now, or declines
    while the transport's write buffer is over its high-water mark (:meth:`pause_writing`) or
    the connection is not open; :meth:`send` writes and then waits for the buffer to drain.

    Keepalive: a ping every :data:`PING_INTERVAL_S`; no pong within :data:`PING_TIMEOUT_S`
    fails the connection with 1011. Any close frame sent or received, the TCP connection is cut
    after :data:`CLOSE_TIMEOUT_S` unless the upstream closed it first.
    """

    #: the handshake's status (the attempt loop reads an answer's)
    status = SWITCHED

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        self._flush()  # pongs, the echo of a close frame
        if protocol.close_expected():
            self._expect_close()
        for event in events:
            if type(event) is Frame:
                opcode = event.opcode
                if opcode is TEXT or opcode is BINARY or opcode is CONT:
                    whole = self._fragments.add(event)
                    if whole is not None:
                        self._message(*whole)
                elif opcode is PONG and event.data == self._ping:
                    self._pong()
                # a ping is answered and a close frame echoed by the protocol itself
            elif isinstance(event, Response):
                self._response()
        if protocol.handshake_exc is not None:  # no HTTP response could be parsed
            self._response()

    # ------------------------------------------------------------ reading

    def _message(self, data: bytes, text: bool) -> None:
        relay = self.relay
        if relay is not None and not self.queued and relay(data, text, self.read_at):
            return
        self.queued += 1
        messages = self._messages
        messages.append((data, text))
        waiter = self._recv_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if len(messages) >= UPSTREAM_QUEUE and not self._reading_paused:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                self._reading_paused = True
                transport.pause_reading()

    async def recv(self) -> Message:
        messages = self._messages
        while not messages:
            if self.lost.done():
                raise self._closed()
            self._recv_waiter = waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._recv_waiter = None
        data, text = messages.popleft()
        if self._reading_paused and len(messages) <= 1:
            self._reading_paused = False
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()
        if not text:
            return data
        try:
            return data.decode()
        except UnicodeDecodeError as exc:  # text that is not UTF-8: 1007, as RFC 6455 says
            reason = f"{exc.reason} at position {exc.start}"
            self._fail(1007, reason)
            raise Closed(1007, reason) from None

    def relayed(self) -> None:
        """The relay wrote a message :meth:`recv` gave it."""
        if self.queued:
            self.queued -= 1

    def attach(self, relay: Take | None) -> None:
        """Offer each whole message read to ``relay`` (None: detach)."""
        self.relay = relay

    # ------------------------------------------------------------ writing

    def write(self, data: bytes, text: bool) -> bool:
        """One message upstream as one frame, now; False when the connection is not open or
        its write buffer is over the high-water mark (nothing written then)."""
        protocol = self.protocol
        if self._paused or protocol.state is not OPEN:
            return False
        if text:
            protocol.send_text(data)
        else:
            protocol.send_binary(data)
        transport = self.transport
        assert transport is not None
        for chunk in protocol.data_to_send():
            transport.write(chunk)
        return True

    @property
    def direct_write(self) -> Callable[[bytes, bool], bool]:
        """:meth:`write`, for the relay's direct path."""
        return self.write

    async def send(self, data: bytes, text: bool) -> None:
        protocol = self.protocol
        if protocol.state is not OPEN:
            await self._ended()
            raise self._closed()
        if text:
            protocol.send_text(data)
        else:
            protocol.send_binary(data)
        self._flush()
        while self._paused and not self.lost.done():
            self._drain_waiter = waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._drain_waiter = None

    async def close(self, code: int, reason: str) -> None:
        self.relay = None
        protocol = self.protocol
        if protocol.state is OPEN:
            protocol.send_close(code, reason)
            self._flush()
            self._expect_close()
        await self._ended()


def _closed(exc: ConnectionClosed) -> Closed:
    rcvd, sent = exc.rcvd, exc.sent
    if rcvd is not None and (sent is None or exc.rcvd_then_sent):  # the upstream closed first
        return Closed(rcvd.code, rcvd.reason)
    if sent is not None:  # we closed it: a message too big (1009), no pong (1011)
        return Closed(sent.code, sent.reason)
    return Closed(1011, "upstream connection lost", lost=True)


async def open_websocket(
    url: str,
    headers: Sequence[tuple[str, str]],
    subprotocols: Sequence[str],
    max_size: int | None,
    open_timeout: float,
) -> WebSocketsSocket:
    """The opening handshake to ``url`` (``ws://`` or ``wss://``), bounded by
    ``open_timeout``: TCP, TLS and the HTTP exchange. Raises ``OSError`` (unreachable),
    ``TimeoutError``, or ``websockets``' ``InvalidURI`` / ``InvalidHandshake`` (its
    ``InvalidStatus`` for an HTTP answer other than 101: a redirect is never followed)."""
    uri = parse_uri(url)
    protocol = ClientProtocol(
        uri,
        subprotocols=[Subprotocol(p) for p in subprotocols] if subprotocols else None,
        max_size=max_size,
    )
    loop = asyncio.get_running_loop()
    conn: WebSocketsSocket | None = None
    try:
        async with asyncio.timeout(open_timeout):
            _, conn = await loop.create_connection(
                lambda: WebSocketsSocket(protocol),
                uri.host,
                uri.port,
                ssl=ssl.create_default_context() if uri.secure else None,
            )
            request = protocol.connect()
            request.headers.update(headers)
            protocol.send_request(request)
            conn._flush()
            await conn.opened
    except BaseException:
        if conn is not None and conn.transport is not None:
            conn.transport.abort()
        raise
    return conn


# ---------------------------------------------------------------- mock://


class MockSocket:
    """A ``mock://`` backend's realtime session, in process (no socket, no framing)."""

    __slots__ = ("_closed", "_inbox", "_session", "read_at", "subprotocol")

    #: the handshake's status (the attempt loop reads an answer's)
    status = SWITCHED

    def __init__(self, settings: MockSettings, model: str, subprotocol: str | None) -> None:
        self.subprotocol = subprotocol
        self.read_at = 0.0
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue(UPSTREAM_QUEUE)
        self._closed: Closed | None = None
        self._session = MockRealtime(settings, model, self._emit)

    async def _emit(self, text: str) -> None:
        if self._closed is not None:
            raise self._closed
        await self._inbox.put(text)

    async def open(self) -> None:
        await self._session.open()

    async def recv(self) -> Message:
        item = await self._inbox.get()
        if item is None:
            assert self._closed is not None
            raise self._closed
        self.read_at = time.perf_counter()
        return item

    async def send(self, data: bytes, text: bool) -> None:
        if self._closed is not None:
            raise self._closed
        await self._session.receive(data.decode() if text else data)

    def relayed(self) -> None:
        return None

    async def close(self, code: int, reason: str) -> None:
        if self._closed is None:
            self._closed = Closed(code, reason)
            await self._session.aclose()
            while not self._inbox.empty():  # nobody reads them any more
                self._inbox.get_nowait()
            self._inbox.put_nowait(None)


__all__ = [
    "CLOSE_TIMEOUT_S",
    "PING_INTERVAL_S",
    "PING_TIMEOUT_S",
    "SWITCHED",
    "UPSTREAM_QUEUE",
    "WRITE_LIMIT",
    "Closed",
    "Message",
    "MockSocket",
    "UpstreamSocket",
    "WebSocketsSocket",
    "open_websocket",
]
