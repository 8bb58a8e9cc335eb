"""The relay of one realtime session: a direct path, two pumps and one close path
(docs/spec.md §19).

::

    client ──read──▶ [direct: written upstream in the same read callback] ──▶ upstream
           ╰─────── receive ──▶ [client pump] ──send──╯                    messages_in
    client ◀── [direct: written to the client in the same read callback] ◀──read── upstream
           ╰─────── send ◀── [upstream pump] ◀── recv ─╯                   messages_out

**The direct path** (when both ends are sockets of this process: the client's end is
:class:`~gateway.server.websocket.RealtimeWebSocketProtocol`, the upstream a
``websockets`` connection): each whole message is offered to the relay by the protocol that
read it, inside its ``data_received``, and written to the other side right there — no queue,
no task switch, no ASGI message, no text decode/encode. A message takes the pump's way
instead when the other side does not take writes now (its write buffer is over the high-water
mark, or it is closing) or a message read before it still waits there: order holds, and the
bounded queues are only the back-pressure.

**The pumps** relay what was queued (all of it without the direct path: a ``mock://``
upstream, another server) and notice each side's end. Each is a small loop with one state
(relaying) and three ways out, each an :class:`End`: its source closed (a close frame, or the
connection lost), its destination refused a write, or the session's own limits stopped it
(idle, session length). Whichever pump ends first decides; the close path then stops the other
pump and closes both sides once:

==========================  ===============================  ================================
what ended it               the client gets                  the upstream gets
==========================  ===============================  ================================
the client closed (code)    (its close was echoed)           the same code and reason
the client vanished         —                                1001, within 1 s
the upstream closed (code)  the same code and reason         (its close was echoed)
the upstream vanished       1011 "upstream connection lost"  —
a message too big           1009 (by ``websockets``)         1009
text that is not UTF-8      1007 (by ``websockets``)         1007
idle_timeout_s              1000 "idle timeout"              1000 "idle timeout"
max_session_s               1000 "session time limit"        1000 "session time limit"
the server's drain          1012 "service restart"           1012 "service restart"
==========================  ===============================  ================================

Each message is written as soon as it is read, never batched. A slow reader slows its sender:
the server stops reading the client's socket while a client message waits, ``websockets`` the
upstream's beyond :data:`~gateway.realtime.upstream_socket.UPSTREAM_QUEUE` waiting messages; each
pump writes the next message only once the last one is written. Pings are answered per hop by
the libraries and never relayed. Per message, the relay stamps where it was read (the socket
read that completed it) and where it was written: the per-frame overhead,
``gateway_realtime_message_overhead_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from gateway.realtime.client_end import READ_AT, ClientEnd
from gateway.realtime.events import SessionResponses
from gateway.realtime.upstream_socket import Closed, UpstreamSocket, WebSocketsSocket
from gateway.types import Receive, Send

#: observes one message's overhead (seconds)
Observe = Callable[[float], None]
#: a text message written, with the time the session's responses count it at
OnText = Callable[[bytes, float], None]

#: by whom a session ended
BY_CLIENT = "client"
BY_UPSTREAM = "upstream"
BY_LIMIT = "limit"
BY_SHUTDOWN = "shutdown"


def sendable(code: int) -> bool:
    """Whether a close code may be sent in a close frame (RFC 6455 §7.4; 1005, 1006 and 1015
    only report what happened)."""
    return code in (1000, 1001, 1002, 1003) or 1007 <= code <= 1014 or 3000 <= code <= 4999


class End:
    """How a session ended."""

    __slots__ = ("by", "code", "reason")

    def __init__(self, by: str, code: int, reason: str) -> None:
        self.by = by
        #: the close code the client's side ended with (what gateway_realtime_sessions_total
        #: counts): the client's own, or the one the gateway sent it
        self.code = code
        self.reason = reason


class Flow:
    """One direction's bookkeeping, written once for the direct path and the pumps: each
    message written is counted, its overhead (read → written) summed, maxed and observed, and a
    text message shown to the session's responses (client → upstream at its read time, the
    time a ``response.create`` was sent; upstream → client at its write time, the time TTFT
    counts)."""

    __slots__ = ("at_write", "max", "messages", "observe", "on_text", "overhead")

    def __init__(self, observe: Observe, on_text: OnText, *, at_write: bool) -> None:
        self.messages = 0
        #: summed and largest per-message overhead (s)
        self.overhead = self.max = 0.0
        self.observe = observe
        self.on_text = on_text
        self.at_write = at_write

    def wrote(self, data: bytes, text: bool, read_at: float, written: float) -> None:
        self.messages += 1
        overhead = written - read_at
        self.overhead += overhead
        if overhead > self.max:
            self.max = overhead
        self.observe(overhead)
        if text:
            self.on_text(data, written if self.at_write else read_at)


class Stats:
    """Counters of one session: the two directions' :class:`Flow`."""

    __slots__ = ("inbound", "outbound")

    def __init__(self, inbound: Flow, outbound: Flow) -> None:
        #: client → upstream, upstream → client
        self.inbound = inbound
        self.outbound = outbound

    @property
    def messages_in(self) -> int:
        return self.inbound.messages

    @property
    def messages_out(self) -> int:
        return self.outbound.messages

    @property
    def overhead_in(self) -> float:
        return self.inbound.overhead

    @property
    def overhead_out(self) -> float:
        return self.outbound.overhead

    @property
    def max_in(self) -> float:
        return self.inbound.max

    @property
    def max_out(self) -> float:
        return self.outbound.max


def _nothing(_seconds: float) -> None:
    return None


#: writes one message now: (message, is text) -> False when the other side does not take it now
Write = Callable[[bytes, bool], bool]


def _not_now(_data: bytes, _text: bool) -> bool:
    return False


class _DirectPath:
    """A :class:`MessageRelay`'s direct path (see the module): each message written to the
    other side in the read callback that completed it."""

    __slots__ = (
        "_client",
        "_direct_up",
        "_last",
        "_queued_in",
        "_server_end",
        "_write_client",
        "_write_up",
    )
    _client: ClientEnd | None
    _server_end: ClientEnd | None
    _direct_up: WebSocketsSocket | None
    _last: float
    _queued_in: int
    _write_up: Write
    _write_client: Write
    # the MessageRelay's, as the direct path uses them
    _up: UpstreamSocket
    _max_bytes: int
    stats: Stats

    def _attach(self) -> None:
        """Both ends are sockets this process reads (the server's protocol, the ``websockets``
        client): each message is offered to the other side as it is read. The server's end is
        the one its protocol offered in ``websocket.connect`` (:data:`CLIENT_END`)."""
        client = self._server_end
        up = self._up
        if not isinstance(up, WebSocketsSocket):
            return  # a mock:// upstream: the pumps relay every message
        if client is None:
            return  # another server: the pumps, likewise
        #: client messages queued for receive() before now (the pump writes them first)
        self._queued_in = client.queue.qsize()
        self._write_up = up.direct_write
        self._write_client = client.write
        client.relay = self._take_in
        up.attach(self._take_out)
        self._client = client
        self._direct_up = up

    @property
    def server_end(self) -> ClientEnd | None:
        """The server's end of the client connection its protocol offered (None: none)."""
        return self._server_end

    @property
    def direct(self) -> bool:
        """Whether the direct path is attached (both ends this process's sockets)."""
        return self._client is not None

    def _detach(self) -> None:
        client, up = self._client, self._direct_up
        if client is not None:
            client.relay = None
        if up is not None:
            up.attach(None)

    def _take_in(self, data: bytes, text: bool, read_at: float) -> bool:
        """A client message, in the read that completed it: written upstream now, unless a
        message read before it still waits, or the upstream does not take writes now (then it
        is queued for the client pump and the server stops reading the client)."""
        if (
            self._queued_in
            or len(data) > self._max_bytes
            or (text and not data.isascii() and not _utf8(data))
            or not self._write_up(data, text)
        ):
            self._queued_in += 1
            return False
        self._last = written = perf_counter()
        self.stats.inbound.wrote(data, text, read_at, written)
        return True

    def _take_out(self, data: bytes, text: bool, read_at: float) -> bool:
        """An upstream message, in the read that completed it: written to the client now,
        unless the client does not take writes now (then ``recv()`` has it for the upstream
        pump, after every message queued before it)."""
        if (text and not data.isascii() and not _utf8(data)) or not self._write_client(data, text):
            return False
        self._last = written = perf_counter()
        self.stats.outbound.wrote(data, text, read_at, written)
        return True


class MessageRelay(_DirectPath):
    __slots__ = (
        "_client_closed",
        "_idle_s",
        "_idle_timer",
        "_max_bytes",
        "_receive",
        "_send",
        "_session_s",
        "_stop",
        "_up",
        "stats",
    )

    def __init__(
        self,
        receive: Receive,
        send: Send,
        upstream: UpstreamSocket,
        responses: SessionResponses,
        *,
        max_message_bytes: int,
        idle_timeout_s: float,
        max_session_s: float,
        observe_in: Observe = _nothing,
        observe_out: Observe = _nothing,
        server_end: ClientEnd | None = None,
    ) -> None:
        self._receive = receive
        #: the server's end of the client connection, as its protocol offered it (None: the
        #: pumps relay every client message)
        self._server_end = server_end
        self._send = send
        self._up = upstream
        self._max_bytes = max_message_bytes
        self._idle_s = idle_timeout_s
        self._session_s = max_session_s
        self._last = time.perf_counter()
        self._stop: asyncio.Future[End] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: the client's side is closed already (its close echoed, or it vanished)
        self._client_closed = False
        self.stats = Stats(
            Flow(observe_in, responses.client_message, at_write=False),
            Flow(observe_out, responses.upstream_message, at_write=True),
        )
        #: the direct path's ends (None: the pumps relay every message)
        self._client: ClientEnd | None = None
        self._direct_up: WebSocketsSocket | None = None
        self._queued_in = 0
        #: the direct path's writes: (message, is text) -> False when not written now
        self._write_up: Write = _not_now
        self._write_client: Write = _not_now

    # ------------------------------------------------------------ the pumps

    async def _from_client(self) -> End:
        """Client messages queued for ``receive()`` (all of them without the direct path), and
        the client's end."""
        receive, up = self._receive, self._up
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":  # websocket.disconnect
                code: int = message.get("code", 1005)
                return End(BY_CLIENT, code, message.get("reason") or "")
            read_at: float = message.get(READ_AT) or time.perf_counter()
            text: str | None = message.get("text")
            data: bytes | None = text.encode() if text is not None else message.get("bytes")
            if data is None:
                continue
            if len(data) > self._max_bytes:  # a server without ws_max_size: the limit holds
                return End(BY_LIMIT, 1009, "message over max_message_bytes")
            try:
                await up.send(data, text is not None)
            except Closed as exc:
                return _upstream_end(exc)
            if self._queued_in:
                self._queued_in -= 1
            self._last = written = time.perf_counter()
            self.stats.inbound.wrote(data, text is not None, read_at, written)

    async def _from_upstream(self) -> End:
        """Upstream messages ``recv()`` has (all of them without the direct path), and the
        upstream's end."""
        send, up = self._send, self._up
        while True:
            try:
                message = await up.recv()
            except Closed as exc:
                return _upstream_end(exc)
            read_at = up.read_at
            try:
                if type(message) is str:
                    await send({"type": "websocket.send", "text": message})
                else:
                    await send({"type": "websocket.send", "bytes": message})
            except OSError:  # the server's ClientDisconnected: the client is gone
                self._client_closed = True
                return End(BY_CLIENT, 1006, "")
            up.relayed()
            self._last = written = time.perf_counter()
            if isinstance(message, str):
                self.stats.outbound.wrote(message.encode(), True, read_at, written)
            else:
                self.stats.outbound.wrote(message, False, read_at, written)

    # ------------------------------------------------------------ the limits

    def _limit(self, reason: str) -> None:
        self.stop(1000, reason, BY_LIMIT)

    def stop(self, code: int, reason: str, by: str) -> None:
        """End the session from outside the pumps (a limit, the server's drain): both sides
        get close ``code`` with ``reason``; nothing once it has ended."""
        stop = self._stop
        if stop is not None and not stop.done():
            stop.set_result(End(by, code, reason))

    def _check_idle(self) -> None:
        quiet = time.perf_counter() - self._last
        if quiet >= self._idle_s - 0.001:
            self._limit("idle timeout")
            return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(self._idle_s - quiet, self._check_idle)

    # ------------------------------------------------------------ run and close

    async def run(self) -> End:
        """Relay until one side ends (or a limit); both sides are closed on return."""
        loop = asyncio.get_running_loop()
        self._stop = stop = loop.create_future()
        self._last = time.perf_counter()
        self._attach()
        from_up = loop.create_task(self._from_upstream())
        from_client = loop.create_task(self._from_client())
        self._idle_timer = loop.call_later(self._idle_s, self._check_idle)
        session_timer = loop.call_later(self._session_s, self._limit, "session time limit")
        try:
            await asyncio.wait((from_up, from_client, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._detach()
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            session_timer.cancel()
            for task in (from_up, from_client):
                task.cancel()
            ended = await asyncio.gather(from_up, from_client, return_exceptions=True)
        end = _decide(stop, ended)
        await self._close(end)
        return end

    async def _close(self, end: End) -> None:
        """The one close path: each side that is still open gets its close."""
        up = self._up
        if end.by == BY_CLIENT:
            # the client closed (its close was echoed) or vanished: the upstream, within 1 s
            code = end.code if sendable(end.code) else 1001
            await up.close(code, end.reason if sendable(end.code) else "client went away")
            return
        if end.by == BY_UPSTREAM:
            await up.close(1000, "")  # already closed: this only releases it
            await self._close_client(end.code, end.reason)
            return
        await self._close_client(end.code, end.reason)
        await up.close(end.code, end.reason)

    async def _close_client(self, code: int, reason: str) -> None:
        if self._client_closed:
            return
        self._client_closed = True
        with contextlib.suppress(OSError, RuntimeError):  # it went away meanwhile
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


def _utf8(data: bytes) -> bool:
    """Whether a text message is valid UTF-8 (a message that is not goes the slow way, where
    the receiving library fails the connection with 1007 as it would without a relay)."""
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _upstream_end(exc: Closed) -> End:
    if exc.lost:
        return End(BY_UPSTREAM, 1011, exc.reason)
    code = exc.code if sendable(exc.code) else 1000
    return End(BY_UPSTREAM, code, exc.reason)


__all__ = [
    "BY_CLIENT",
    "BY_LIMIT",
    "BY_SHUTDOWN",
    "BY_UPSTREAM",
    "End",
    "Flow",
    "MessageRelay",
    "Stats",
    "sendable",
]


def _decide(stop: asyncio.Future[End], ended: Sequence[Any]) -> End:
    """How the session ended: a limit or close already decided, else the client's own end,
    else the upstream's; a pump that raised raises here."""
    if stop.done():
        return stop.result()
    up_end, client_end = ended
    if isinstance(client_end, End):
        return client_end  # the client's own end is the most definite
    if isinstance(up_end, End):
        return up_end
    if isinstance(client_end, BaseException) and not isinstance(client_end, asyncio.CancelledError):
        raise client_end
    if isinstance(up_end, BaseException):
        raise up_end
    raise AssertionError("a pump ended without an outcome")  # pragma: no cover
