"""The connection's half of the server's WebSocket protocol: frames in and out, the close
handshake, keepalive, back-pressure and the drain's shutdown.

:class:`ClientSocket` is what :class:`~gateway.server.websocket.RealtimeWebSocketProtocol` (the
ASGI half: the handshake, ``receive`` and ``send``) is built on. ``websockets``' public sans-I/O
:class:`~websockets.server.ServerProtocol` parses, unmasks and writes every frame; this half
moves its bytes to and from the transport, and:

- reads: each whole message goes to the relay's direct path when one is attached and takes it
  (:attr:`~gateway.realtime.client_end.ClientEnd.relay`), else to the app's queue — and reading
  pauses while a message waits there; text that is not UTF-8 fails the connection with 1007, a
  message over ``max_size`` with 1009 (``websockets`` counts a fragmented message whole);
- writes: :meth:`ClientSocket.write` is one message as one frame, now, when the connection is
  open and its write buffer under the high-water mark (else ``False``);
- keepalive (:class:`Keepalive`): a ping every :data:`PING_INTERVAL_S` once accepted, a pong due
  within :data:`PING_TIMEOUT_S` (else 1011); the client's pings are answered by ``websockets``;
- the close: the gateway's close frame, then the client's answer or :data:`CLOSE_TIMEOUT_S`
  closes the socket (a server closes first);
- the drain (:meth:`ClientSocket.shutdown`): a relaying session closes itself when its model
  response is done; anything else gets 1012 at once.
"""

from __future__ import annotations

import asyncio
import random
import time

from websockets.frames import Frame
from websockets.http11 import Response
from websockets.protocol import OPEN, SEND_EOF
from websockets.server import ServerProtocol

from gateway.realtime.client_end import READ_AT, ClientEnd
from gateway.realtime.frames import BINARY, CONT, PONG, TEXT, Reassembly
from gateway.server.state import Served
from gateway.types import Message

#: keepalive (uvicorn's defaults, which served this hop before): a ping this long after the
#: accept and after each pong, and the connection fails with 1011 when no pong comes this long
PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
#: after the gateway's close frame, how long the client has to answer it before the socket is
#: closed anyway
CLOSE_TIMEOUT_S = 10.0


class ClientDisconnected(OSError):
    """``send`` on a connection the client has left (an ``OSError``: the relay's pump ends on
    it)."""


class Keepalive:
    """Pings to the client once accepted: one every :attr:`ping_interval`, each pong due within
    :attr:`ping_timeout` (else the connection fails with 1011). The next ping is timed from
    the pong, so a slow client is not pinged again before it answered."""

    #: per instance (tests shorten them)
    ping_interval: float | None = PING_INTERVAL_S
    ping_timeout: float | None = PING_TIMEOUT_S

    conn: ServerProtocol
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Message]
    close_sent: bool
    _ping_timer: asyncio.TimerHandle | None = None
    _pong_timer: asyncio.TimerHandle | None = None
    _ping_payload: bytes | None = None

    def _flush_and_close(self) -> None:
        raise NotImplementedError

    def _start_keepalive(self) -> None:
        if self.ping_interval:
            self._ping_timer = self.loop.call_later(self.ping_interval, self._ping)

    def _stop_keepalive(self) -> None:
        for timer in (self._ping_timer, self._pong_timer):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._pong_timer = self._ping_payload = None

    def _ping(self) -> None:
        self._ping_timer = None
        if self.close_sent or self.transport.is_closing():
            return
        # a random payload tells this ping's pong from a stale or unsolicited one
        self._ping_payload = payload = random.getrandbits(32).to_bytes(4, "big")
        self.conn.send_ping(payload)
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self.ping_timeout:
            self._pong_timer = self.loop.call_later(self.ping_timeout, self._pong_overdue)
        else:
            self._start_keepalive()

    def _pong(self, event: Frame) -> None:
        if self._ping_payload is None or bytes(event.data) != self._ping_payload:
            return
        self._ping_payload = None
        if self._pong_timer is not None:
            self._pong_timer.cancel()
            self._pong_timer = None
            self._start_keepalive()

    def _pong_overdue(self) -> None:
        self._pong_timer = self._ping_payload = None
        if self.close_sent or self.transport.is_closing():
            return
        self.close_sent = True
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1011})
        self.conn.fail(1011, "keepalive ping timeout")
        self._flush_and_close()


class ClientSocket(Keepalive, ClientEnd, asyncio.Protocol):
    """The transport's half of :class:`~gateway.server.websocket.RealtimeWebSocketProtocol`:
    frames in and out, the close handshake, keepalive, back-pressure and shutdown (see the
    module). The ASGI half (the app's ``receive``/``send``) is the subclass; a realtime session
    sees it as its :class:`~gateway.realtime.client_end.ClientEnd`."""

    close_timeout = CLOSE_TIMEOUT_S

    read_at = 0.0
    #: the transport's write buffer is over its high-water mark (a plain flag: :meth:`write`
    #: reads it per message)
    write_paused = False

    def __init__(
        self,
        connections: set[Served],
        tasks: set[asyncio.Task[None]],
        loop: asyncio.AbstractEventLoop,
        max_size: int | None,
    ) -> None:
        self.connections = connections
        self.tasks = tasks
        self.loop = loop
        # websockets logs to its own logger ("websockets.server"): its INFO lines per connection
        # stay out of the gateway's log
        self.conn = ServerProtocol(max_size=max_size)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        #: the app's inbox (``websocket.connect``, ``receive``, ``disconnect``)
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        self.read_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        #: the 101 was sent (or the handshake answered otherwise: then ``answered`` too)
        self.handshake_complete = False
        #: the handshake was answered with HTTP (refused): no frame is ever sent
        self.answered = False
        #: the gateway sent its close frame (or failed the connection)
        self.close_sent = False
        #: the server shut down while the app was still deciding the handshake
        self.stopping = False
        self.disconnected = False
        self._close_timer: asyncio.TimerHandle | None = None
        #: a fragmented message being read: its frames, and whether it is text
        self._fragments = Reassembly()

    # ------------------------------------------------------------ the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has its methods
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_keepalive()
        code = 1005 if self.handshake_complete and not self.answered else 1006
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code})
        self.connections.discard(self)
        self.handshake_complete = self.disconnected = True
        # a send waiting for a buffer that will never drain now
        self.write_paused = False
        self._writable.set()
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None

    def eof_received(self) -> None:
        pass  # the transport closes; connection_lost follows

    def pause_writing(self) -> None:
        self.write_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        conn = self.conn
        conn.receive_data(data)
        # past the handshake, every event is a frame
        events: list[Frame] = conn.events_received()  # type: ignore[assignment]
        for event in events:
            opcode = event.opcode
            if opcode is TEXT or opcode is BINARY or opcode is CONT:
                whole = self._fragments.add(event)
                if whole is not None:
                    self._message(*whole)
            elif opcode is PONG:
                self._pong(event)
        writes = conn.data_to_send()  # pongs; a close frame and the end of the stream
        if writes:
            if writes[-1] == SEND_EOF:
                self._closing(writes)
            else:
                self.transport.write(b"".join(writes))

    def _message(self, data: bytes, text: bool) -> None:
        """A whole message: to the relay when it takes it, else queued for ``receive()``."""
        if self.close_sent:
            return  # past the gateway's close: dropped, reads go on until the client's answer
        relay = self.relay
        if relay is not None and relay(data, text, self.read_at):
            return
        if text:
            try:
                message: Message = {"type": "websocket.receive", "text": data.decode()}
            except UnicodeDecodeError:  # failed as websockets' own client would: 1007
                self.close_sent = True  # nothing read after it is taken
                reason = "invalid UTF-8"
                self.queue.put_nowait(
                    {"type": "websocket.disconnect", "code": 1007, "reason": reason}
                )
                self.conn.fail(1007, reason)
                return  # data_received writes the close and closes
        else:
            message = {"type": "websocket.receive", "bytes": data}
        message[READ_AT] = self.read_at
        self.queue.put_nowait(message)
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def _closing(self, writes: list[bytes]) -> None:
        """``websockets`` ended the stream after a read: the client's close frame (echoed), its
        answer to the gateway's, or a frame it failed the connection on (1009 too big, 1002,
        1007). What it wrote goes out, then the socket is closed (a server closes first)."""
        conn = self.conn
        if not self.close_sent:
            self.close_sent = True
            rcvd, sent = conn.close_rcvd, conn.close_sent
            close = rcvd if rcvd is not None else sent
            code, reason = (close.code, close.reason) if close is not None else (1006, "")
            self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self._stop_keepalive()
        transport = self.transport
        if not transport.is_closing():
            transport.write(b"".join(writes))
            transport.close()

    def _flush_and_close(self) -> None:
        transport = self.transport
        out = b"".join(self.conn.data_to_send())
        if out and not transport.is_closing():
            transport.write(out)
        transport.close()

    def write(self, data: bytes, text: bool) -> bool:
        """One message to the client as one frame, now; False when the connection is not open
        or its write buffer is over the high-water mark (nothing written then)."""
        conn = self.conn
        if (
            self.write_paused
            or self.close_sent
            or conn.state is not OPEN
            or self.transport.is_closing()
        ):
            return False
        if text:
            conn.send_text(data)
        else:
            conn.send_binary(data)
        self.transport.write(b"".join(conn.data_to_send()))
        return True

    def send_close(self, code: int, reason: str) -> None:
        """The gateway's close frame; the client's answer closes the socket, or the timeout."""
        if self.close_sent or self.transport.is_closing():
            return
        self.close_sent = True
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.conn.send_close(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self._stop_keepalive()
        if self.read_paused:  # read on, for the client's close frame
            self.read_paused = False
            self.transport.resume_reading()
        self._close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    def shutdown(self) -> None:
        """The server stops (SIGTERM): a relaying session drains — it closes itself with 1012
        once its model response is done, or just before ``shutdown_grace_s`` is over; any other
        open session gets 1012 at once. A handshake the app is still deciding (auth, the
        upstream's handshake) is let finish: a refusal goes out as HTTP, an accept is followed
        by 1012 at once — the client reconnects, as from any drained session, where a 500 would
        read as the gateway's fault."""
        drain = self.drain
        if drain is not None and not self.close_sent and not self.transport.is_closing():
            self.drain = None
            drain()
            return
        if not self.handshake_complete and not self.transport.is_closing():
            self.stopping = True
            return
        self._stop_keepalive()
        if self.close_sent:
            if self._close_timer is not None:
                self._close_timer.cancel()
                self._close_timer = None
        elif not self.answered:
            self.close_sent = True
            self.queue.put_nowait({"type": "websocket.disconnect", "code": 1012})
            self.conn.send_close(1012)
            self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    def refuse(self, status: int, text: str) -> None:
        """A plain-text HTTP answer to the handshake (nothing once it is answered)."""
        if self.handshake_complete:
            return
        self.respond(self.conn.reject(status, text))

    def respond(self, response: Response) -> None:
        """The handshake's HTTP answer, other than a 101: sent, and the socket closed."""
        self.handshake_complete = self.answered = self.close_sent = True
        self.conn.send_response(response)
        self._flush_and_close()


__all__ = [
    "CLOSE_TIMEOUT_S",
    "PING_INTERVAL_S",
    "PING_TIMEOUT_S",
    "ClientDisconnected",
    "ClientSocket",
    "Keepalive",
]
