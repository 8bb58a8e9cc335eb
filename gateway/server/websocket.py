"""The server's side of a WebSocket upgrade: the gateway's own asyncio WebSocket protocol, on
``websockets``' public sans-I/O :class:`~websockets.server.ServerProtocol`, with socket stamps
and a direct path for a realtime session's relay.

gateway/server/http1.py's protocol hands a WebSocket upgrade (``GET /v1/realtime`` with
``Upgrade: websocket``) over with the transport (:meth:`Http1Protocol._upgrade`), with the
:class:`~gateway.server.state.ServerState` it was built with (the app, the lifespan state, the
``connections`` and ``tasks`` sets, ``[realtime] max_message_bytes``) and the head it parsed
(scope, target, headers). That head, written out again, is fed to ``websockets``
(``receive_data``: its own request parser, once per session), which validates the handshake
(``accept``: a 101, or the 400/426 it answers a bad one with, sent as is and the connection
closed) exactly as its servers do; from then on the frames are parsed, unmasked (in C,
``websockets.speedups``) and written by ``websockets``, never by the gateway. Nothing here
reaches into uvicorn, nor below ``websockets``' documented sans-I/O API (``receive_data``,
``events_received``, ``data_to_send``, ``accept``, ``reject``, ``send_response``, ``send_*``,
``fail``, ``state``; and the ``close_rcvd`` / ``close_sent`` attributes for the codes of a
close, as ``websockets``' own asyncio connection reads them).

What the app gets is ASGI's WebSocket interface (``websocket.connect``, ``accept``, ``send``,
``receive``, ``close``, ``disconnect``) with the ``websocket.http.response`` extension, which
the gateway answers refusals with (401, 404, 502 ... as HTTP, never an accepted socket closed at
once; a ``websocket.close`` before accepting is a 403). Beside it:

- :data:`~gateway.context.RECEIVED_AT` on ``websocket.connect``: the upgrade request's first
  byte, as the HTTP protocol stamped it (its scope's ``received``);
- :data:`~gateway.realtime.client_end.CLIENT_END` on ``websocket.connect``: the protocol itself
  (a :class:`~gateway.realtime.client_end.ClientEnd`), where a session registers its relay's
  direct path (:attr:`~RealtimeWebSocketProtocol.relay`) and its drain
  (:attr:`~RealtimeWebSocketProtocol.drain`);
- :data:`~gateway.realtime.client_end.READ_AT` on each ``websocket.receive``: when the socket
  read that completed the message happened (stamped as it is queued);
- back-pressure: reading pauses while a message waits in the app's queue and resumes once the
  app has taken every queued one; a transport over its high-water mark makes ``send`` wait;
- a message over ``max_size`` (``[realtime] max_message_bytes``) fails the connection with 1009
  (``websockets`` counts a fragmented message whole); text that is not UTF-8, with 1007;
- keepalive: a ping every
  :data:`~gateway.server.websocket_connection.PING_INTERVAL_S` once accepted, and a pong due
  within :data:`~gateway.server.websocket_connection.PING_TIMEOUT_S` (else 1011), as uvicorn's
  defaults did (the client's pings are answered by ``websockets``);
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

The connection's half (frames, the close, keepalive, back-pressure, the drain) is
:mod:`gateway.server.websocket_connection`; this module is the handshake and the ASGI half.

Why reach past ASGI: the ASGI hops cost a queue, a task switch, a message dict and a text
decode/encode per message each way (``loadtests/realtime.py`` measures it).

Why ``websockets`` rather than ``wsproto``: the same library is the upstream client
(:mod:`gateway.realtime.upstream_socket`), and its C speedups. Per-message deflate is never offered
(no extension is negotiated): a relay would inflate and deflate every frame.
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import logging
import time
from typing import Any

import httptools
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.protocol import OPEN

from gateway.context import RECEIVED_AT
from gateway.realtime.client_end import CLIENT_END
from gateway.server.state import ServerState
from gateway.server.websocket_connection import ClientDisconnected, ClientSocket
from gateway.target import BadTarget, canonical_path
from gateway.types import Message

log = logging.getLogger("gateway")


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


class RealtimeWebSocketProtocol(ClientSocket):
    """A WebSocket connection taken over from gateway/server/http1.py's protocol, serving the
    ASGI app, stamping socket reads, with the relay's direct path (see the module)."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(state.connections, state.tasks, loop, state.ws_max_size)
        self.app = state.app
        self.lifespan_state = state.lifespan_state
        self.scope: dict[str, Any] = {}
        self._response: Response | None = None
        #: a ``websocket.http.response.start`` waiting for its body: (status, headers, body)
        self._http: tuple[int, list[tuple[str, str]], bytes] | None = None

    def upgrade(self, http_scope: dict[str, Any], url: bytes, headers: list[Any]) -> None:
        """The handshake, from the request head gateway/server/http1.py parsed (its scope,
        target and headers): validated by ``websockets`` — a bad one gets its answer and the
        socket is closed — else the app's task starts with ``websocket.connect`` queued."""
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
        (docs/spec.md §25: gateway/server/http1.py hands a canonical one over; it is checked
        again here in one match), so no module can read a second spelling of it."""
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
            "state": self.lifespan_state.copy(),
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


__all__ = ["RealtimeWebSocketProtocol"]
