"""The client side of a realtime session: the gateway's own asyncio WebSocket protocol, on
``websockets``' public sans-I/O :class:`~websockets.server.ServerProtocol`, with socket stamps
and a direct path for the relay.

gateway/http1.py's protocol hands a WebSocket upgrade (``GET /v1/realtime`` with ``Upgrade:
websocket``) over with the transport (:meth:`Http1Protocol._upgrade`), built from its own
attributes: the app, the lifespan state, the server's ``connections`` and ``tasks`` sets, the
loop, ``[realtime] max_message_bytes``, and the head it parsed (scope, target, headers). That
head, written out again, is fed to ``websockets`` (``receive_data``: its own request parser,
once per session), which validates the handshake (``accept``: a 101, or the 400/426 it answers
a bad one with, sent as is and the connection closed) exactly as its servers do; from then on
the frames are parsed, unmasked (in C, ``websockets.speedups``) and written by ``websockets``,
never by the gateway. Nothing here reaches into uvicorn, nor below ``websockets``' documented
sans-I/O API (``receive_data``, ``events_received``, ``data_to_send``, ``accept``, ``reject``,
``send_response``, ``send_*``, ``fail``, ``state``; and the ``close_rcvd`` / ``close_sent``
attributes for the codes of a close, as ``websockets``' own asyncio connection reads them).

What the app gets is ASGI's WebSocket interface (``websocket.connect``, ``accept``, ``send``,
``receive``, ``close``, ``disconnect``) with the ``websocket.http.response`` extension, which
the gateway answers refusals with (401, 404, 502 ... as HTTP, never an accepted socket closed at
once; a ``websocket.close`` before accepting is a 403). Beside it:

- :data:`~gateway.context.RECEIVED_AT` on ``websocket.connect``: the upgrade request's first
  byte, as the HTTP protocol stamped it (its scope's ``received``);
- :data:`CLIENT_END` on ``websocket.connect``: the protocol itself, where a session registers
  its relay's direct path (:attr:`~RealtimeWebSocketProtocol.relay`) and its drain
  (:attr:`~RealtimeWebSocketProtocol.drain`);
- :data:`READ_AT` on each ``websocket.receive``: when the socket read that completed the
  message happened (stamped as it is queued);
- back-pressure: reading pauses while a message waits in the app's queue and resumes once the
  app has taken every queued one; a transport over its high-water mark makes ``send`` wait;
- a message over ``max_size`` (``[realtime] max_message_bytes``) fails the connection with 1009
  (``websockets`` counts a fragmented message whole); text that is not UTF-8, with 1007;
- keepalive: a ping every :data:`PING_INTERVAL_S` once accepted, and a pong due within
  :data:`PING_TIMEOUT_S` (else 1011), as uvicorn's defaults did (the client's pings are answered
  by ``websockets``);
- a drain on shutdown (:meth:`~RealtimeWebSocketProtocol.shutdown`, :attr:`drain`): a relaying
  session closes itself when its model response is done; anything else gets 1012 at once (a
  handshake still in the app's hands: right after its accept);
- the relay's direct path (docs/spec.md §19, "each written as soon as it is read"): while a
  relay is attached (:attr:`~RealtimeWebSocketProtocol.relay`), each whole message read is
  offered to it in the same ``data_received`` call, and the relay writes it to the upstream at
  once when the upstream takes writes and nothing read before it still waits; only otherwise is
  it queued for ``receive()`` (and reading pauses: the bounded queue is the back-pressure).
  :meth:`~RealtimeWebSocketProtocol.write` is the other way: one message written as one frame
  now, when the connection is open and its write buffer under the high-water mark, else
  ``False`` (the relay then sends it through ASGI ``send``, which waits).

Why reach past ASGI: the ASGI hops cost a queue, a task switch, a message dict and a text
decode/encode per message each way (``loadtests/realtime.py`` measures it).

Why ``websockets`` rather than ``wsproto``: the same library is the upstream client
(:mod:`gateway.realtime.upstream`), and its C speedups. Per-message deflate is never offered
(no extension is negotiated): a relay would inflate and deflate every frame.
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import httptools
from websockets.datastructures import Headers
from websockets.frames import Frame
from websockets.http11 import Request, Response
from websockets.protocol import OPEN, SEND_EOF
from websockets.server import ServerProtocol

from gateway.context import RECEIVED_AT
from gateway.realtime.frames import BINARY, CONT, PONG, TEXT, Reassembly
from gateway.target import BadTarget, canonical_path
from gateway.types import ASGIApp, Message

log = logging.getLogger("gateway")

#: the key of ``time.perf_counter()`` of the read that completed a ``websocket.receive``
READ_AT = "gateway.read_at"

#: the relay's hook: (message, is text, read at) -> True when it took (wrote) the message
Take = Callable[[bytes, bool, float], bool]
#: the key of the server's own end of the connection in ``websocket.connect``: the protocol
#: offers itself, and a session registers its relay's direct path (:attr:`relay`) and its
#: drain (:attr:`drain`) there — no probing of ``receive.__self__``
CLIENT_END = "gateway.client_end"

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


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


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


class ClientSocket(Keepalive, asyncio.Protocol):
    """The transport's half of :class:`RealtimeWebSocketProtocol`: frames in and out, the
    close handshake, keepalive, back-pressure and shutdown. The ASGI half (the app's
    ``receive``/``send``) is the subclass."""

    close_timeout = CLOSE_TIMEOUT_S

    read_at = 0.0
    #: the transport's write buffer is over its high-water mark (a plain flag: :meth:`write`
    #: reads it per message)
    write_paused = False
    #: the relay offered each whole message read (None: every message goes to ``receive()``)
    relay: Take | None = None
    #: the session's drain, while it relays: called when the server shuts down, instead of
    #: closing at once (docs/spec.md §13: a drain, as for streams)
    drain: Callable[[], None] | None = None

    def __init__(
        self,
        connections: set[Any],
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


class RealtimeWebSocketProtocol(ClientSocket):
    """A WebSocket connection taken over from gateway/http1.py's protocol, serving the ASGI
    app, stamping socket reads, with the relay's direct path (see the module)."""

    def __init__(
        self,
        app: ASGIApp,
        app_state: dict[str, Any],
        connections: set[Any],
        tasks: set[asyncio.Task[None]],
        loop: asyncio.AbstractEventLoop,
        max_size: int | None,
    ) -> None:
        super().__init__(connections, tasks, loop, max_size)
        self.app = app
        self.app_state = app_state
        self.scope: dict[str, Any] = {}
        self._response: Response | None = None
        #: a ``websocket.http.response.start`` waiting for its body: (status, headers, body)
        self._http: tuple[int, list[tuple[str, str]], bytes] | None = None

    def upgrade(self, http_scope: dict[str, Any], url: bytes, headers: list[Any]) -> None:
        """The handshake, from the request head gateway/http1.py parsed (its scope, target and
        headers): validated by ``websockets`` — a bad one gets its answer and the socket is
        closed — else the app's task starts with ``websocket.connect`` queued."""
        conn = self.conn
        head = [http_scope["method"].encode(), b" ", url, b" HTTP/1.1\r\n"]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        conn.receive_data(b"".join(head))
        events = conn.events_received()
        request = events[0] if events else None
        if not isinstance(request, Request):  # websockets could not parse it (too long ...)
            self.handshake_complete = self.answered = self.close_sent = True
            out = b"".join(conn.data_to_send())
            if not out:
                text = "Failed to open a WebSocket connection: invalid request.\n"
                out = conn.reject(400, text).serialize()
            self.transport.write(out)
            self.transport.close()
            return
        response = conn.accept(request)
        if response.status_code != 101:
            self.respond(response)
            return
        try:
            target = httptools.parse_url(url)
            path = canonical_path(target.path or b"/")
        except (httptools.HttpParserInvalidURLError, BadTarget):
            self.respond(conn.reject(400, "Failed to open a WebSocket connection: bad target.\n"))
            return
        self._response = response
        self.scope = self._scope(http_scope, path, target.query or b"", headers, request)
        connect: Message = {"type": "websocket.connect", CLIENT_END: self}
        received = http_scope.get(RECEIVED_AT)
        connect[RECEIVED_AT] = received if isinstance(received, float) else time.perf_counter()
        self.queue.put_nowait(connect)
        task = self.loop.create_task(self.run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _scope(
        self,
        http_scope: dict[str, Any],
        path: bytes,
        query: bytes,
        headers: list[Any],
        request: Request,
    ) -> dict[str, Any]:
        """The session's ASGI scope. ``path`` and ``raw_path`` are both the canonical target
        (docs/spec.md §25: gateway/http1.py hands a canonical one over; it is checked again
        here in one match), so no module can read a second spelling of it."""
        root_path: str = http_scope.get("root_path", "")
        subprotocols = [
            token.strip()
            for header in request.headers.get_all("Sec-WebSocket-Protocol")
            for token in header.split(",")
            if token.strip()
        ]
        return {
            "type": "websocket",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "scheme": "wss" if http_scope.get("scheme") == "https" else "ws",
            "server": http_scope.get("server"),
            "client": http_scope.get("client"),
            "root_path": root_path,
            "path": root_path + path.decode("ascii"),
            "raw_path": root_path.encode() + path,
            "query_string": query,
            "headers": headers,
            "subprotocols": subprotocols,
            "state": self.app_state.copy(),
            "extensions": {"websocket.http.response": {}},
        }

    async def run(self) -> None:
        try:
            await self.app(self.scope, self.receive, self.send)
        except ClientDisconnected:
            pass
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            self.refuse(500, "Internal Server Error")
        else:
            if not self.handshake_complete:
                log.error("ASGI callable returned without completing handshake.")
                self.refuse(500, "Internal Server Error")
        if self._close_timer is None:
            self.transport.close()

    # ------------------------------------------------------------ ASGI

    async def receive(self) -> Message:
        message = await self.queue.get()
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            self.transport.resume_reading()
        return message

    async def send(self, message: Message) -> None:
        if self.write_paused:
            await self._writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        kind = message["type"]
        if not self.handshake_complete:
            self._handshake(kind, message)
        elif self._http is not None:
            self._http_body(kind, message)
        elif kind == "websocket.send" and not self.answered:
            self._send(message)
        elif kind == "websocket.close" and not self.answered:
            self.send_close(message.get("code", 1000), message.get("reason") or "")
        else:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} on a WebSocket connection.")

    def _send(self, message: Message) -> None:
        conn = self.conn
        if self.close_sent or conn.state is not OPEN or self.transport.is_closing():
            raise ClientDisconnected()  # closing: the client gets nothing more
        data = message.get("bytes")
        if data is not None:
            conn.send_binary(data)
        else:
            text = message.get("text")
            if text is None:
                return
            conn.send_text(text.encode())
        self.transport.write(b"".join(conn.data_to_send()))

    def _handshake(self, kind: str, message: Message) -> None:
        if kind == "websocket.accept":
            response = self._response
            assert response is not None
            self._response = None
            for name, value in message.get("headers") or ():
                response.headers[name.decode("latin-1")] = value.decode("latin-1")
            subprotocol = message.get("subprotocol")
            if subprotocol:
                response.headers["Sec-WebSocket-Protocol"] = subprotocol
            if not self.transport.is_closing():
                self.handshake_complete = True
                self.conn.send_response(response)
                self.transport.write(b"".join(self.conn.data_to_send()))
                if self.stopping:  # the server is draining: this session is over at once
                    self.send_close(1012, "")
                else:
                    self._start_keepalive()
        elif kind == "websocket.close":  # refused without the extension: 403
            self.queue.put_nowait({"type": "websocket.disconnect", "code": 1006})
            self.refuse(403, "")
        elif kind == "websocket.http.response.start":
            status = message["status"]
            if not 100 <= status < 600:
                raise RuntimeError(f"Invalid HTTP status code {status!r} in response.")
            headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers") or ()
            ]
            self._http = (status, headers, b"")
            self.handshake_complete = self.answered = True
        else:
            raise RuntimeError(
                "Expected ASGI message 'websocket.accept', 'websocket.close' or "
                f"'websocket.http.response.start' but got {kind!r}."
            )

    def _http_body(self, kind: str, message: Message) -> None:
        if kind != "websocket.http.response.body":
            raise RuntimeError(
                f"Expected ASGI message 'websocket.http.response.body', got {kind!r}"
            )
        assert self._http is not None
        status, fields, body = self._http
        body += message.get("body", b"")
        self._http = (status, fields, body)
        if message.get("more_body", False):
            return
        headers = Headers(fields)
        headers.setdefault("Connection", "close")
        headers.setdefault("Content-Length", str(len(body)))
        headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        headers.setdefault("Date", email.utils.formatdate(usegmt=True))
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1006})
        self._http = None
        self.respond(Response(status, _phrase(status), headers, body))


__all__ = ["CLIENT_END", "READ_AT", "ClientDisconnected", "RealtimeWebSocketProtocol", "Take"]
