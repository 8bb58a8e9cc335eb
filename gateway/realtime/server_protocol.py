"""The client side of a realtime session: uvicorn's WebSocket protocol with socket stamps and a
direct path for the relay.

uvicorn serves the upgrade (``GET /v1/realtime`` with ``Upgrade: websocket``) with
``websockets``' sans-I/O protocol (:class:`~uvicorn.protocols.websockets.websockets_sansio_impl.
WebSocketsSansIOProtocol`): the frames are parsed, masked and written by ``websockets``, never by
the gateway. This subclass adds:

- :data:`~gateway.context.RECEIVED_AT` on ``websocket.connect``: the upgrade request's first
  byte, as the HTTP protocol stamped it (the upgrade comes from gateway/http1.py's protocol,
  which is still the transport's protocol while this one is being connected), else the moment
  the upgrade was handed over;
- :data:`READ_AT` on each ``websocket.receive``: when the read that completed the message
  happened. The stamp of the last read is exact for every message the app receives: uvicorn
  pauses reading as soon as a message is queued and resumes only once the app has taken every
  queued message, so no later read can happen before the app has the message;
- a drain on shutdown (:meth:`shutdown`, :attr:`drain`);
- the relay's direct path (docs/spec.md §19, "each written as soon as it is read"): while a
  relay is attached (:attr:`relay`), each whole message read is offered to it in the same
  ``data_received`` call, and the relay writes it to the upstream at once when the upstream
  takes writes and nothing read before it still waits; only otherwise is it queued for
  ``receive()`` as uvicorn does (and reading pauses: the bounded queue is the back-pressure).
  :meth:`write` is the other way: one message written as one frame now, when the connection is
  open and its write buffer under the high-water mark, else ``False`` (the relay then sends it
  through ASGI ``send``, which waits).

Why reach past ASGI: the ASGI hops cost a queue, a task switch, a message dict and a text
decode/encode per message each way (``loadtests/realtime.py`` measures it). What this reaches
into is uvicorn's protocol (``handle_text``, ``handle_bytes``, ``send_receive_event_to_app``,
``frames``, ``curr_msg_data_type``, ``conn``, ``queue``, ``writable``, ``close_sent``): pinned
by ``uvicorn<0.56`` in ``pyproject.toml``; the same names (and ``shutdown``) are there from
0.53 (the lowest bound) to 0.55. The ``pause_writing`` / ``resume_writing`` below are 0.55's,
so a slow client slows its sender on every version allowed.

Why ``websockets`` rather than ``wsproto`` (both are maintained, both work under uvicorn): the
same library is the upstream client (:mod:`gateway.realtime.upstream`), its frame masking and
UTF-8 checks run in C (``websockets.speedups``), and uvicorn's sans-I/O protocol keeps the
``websocket.http.response`` extension the gateway answers refusals with (401, 404, 502 ... as
HTTP, never an accepted socket closed at once). Per-message deflate is off on both hops: a relay
would inflate and deflate every frame (``loadtests/realtime.py`` measures the per-frame cost).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from uvicorn._types import ASGIReceiveEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame
from websockets.protocol import OPEN

from gateway.context import RECEIVED_AT

#: the key of ``time.perf_counter()`` of the read that completed a ``websocket.receive``
READ_AT = "gateway.read_at"

#: the relay's hook: (message, is text, read at) -> True when it took (wrote) the message
Take = Callable[[bytes, bool, float], bool]
#: the key of the server's own end of the connection in ``websocket.connect``: the protocol
#: offers itself, and a session registers its relay's direct path (:attr:`relay`) and its
#: drain (:attr:`drain`) there — no probing of ``receive.__self__``
CLIENT_END = "gateway.client_end"


class RealtimeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, stamping socket reads, with the relay's direct
    path (see the module)."""

    read_at = 0.0
    received_at = 0.0
    #: the transport's write buffer is over its high-water mark (``writable`` cleared, as a
    #: plain flag: :meth:`write` reads it per message)
    write_paused = False
    #: the relay offered each whole message read (None: every message goes to ``receive()``)
    relay: Take | None = None
    #: the session's drain, while it relays: called when the server shuts down, instead of
    #: closing at once (docs/spec.md §13: a drain, as for streams)
    drain: Callable[[], None] | None = None

    def connection_made(self, transport: Any) -> None:
        # the upgrading HTTP protocol is still the transport's: its scope has the socket stamp
        upgraded = getattr(transport.get_protocol(), "scope", None)
        stamp = upgraded.get(RECEIVED_AT) if isinstance(upgraded, dict) else None
        self.received_at = stamp if isinstance(stamp, float) else time.perf_counter()
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.writable.set()  # uvicorn < 0.55: a send waiting for a buffer that never drains

    def pause_writing(self) -> None:
        self.write_paused = True
        self.writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.writable.set()

    def shutdown(self) -> None:
        """The server stops (SIGTERM): a relaying session drains — it closes itself with 1012
        once its model response is done, or just before ``shutdown_grace_s`` is over — where
        uvicorn would close every session with 1012 at once, mid-answer."""
        drain = self.drain
        if drain is not None and not self.close_sent and not self.transport.is_closing():
            self.drain = None
            drain()
            return
        super().shutdown()

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        super().data_received(data)

    # a whole message in one frame (nearly all of them): to the relay straight from the frame
    # (uvicorn's handle_text / handle_bytes would list it in ``frames`` for
    # send_receive_event_to_app, a call and a list more per message)

    def handle_text(self, event: Frame) -> None:
        relay = self.relay
        if (
            relay is None
            or not event.fin
            or self.close_sent
            or not relay(event.data, True, self.read_at)  # type: ignore[arg-type]
        ):
            super().handle_text(event)

    def handle_bytes(self, event: Frame) -> None:
        relay = self.relay
        if (
            relay is None
            or not event.fin
            or self.close_sent
            or not relay(event.data, False, self.read_at)  # type: ignore[arg-type]
        ):
            super().handle_bytes(event)

    def send_receive_event_to_app(self) -> None:
        relay, frames = self.relay, self.frames
        # a fragmented message, whole (one frame: handle_text / handle_bytes offered it already)
        if (
            relay is not None
            and len(frames) > 1
            and not self.close_sent
            and relay(b"".join(frames), self.curr_msg_data_type == "text", self.read_at)
        ):
            self.frames = []
            return
        super().send_receive_event_to_app()

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

    async def receive(self) -> ASGIReceiveEvent:
        message = cast(dict[str, Any], await super().receive())
        if message["type"] == "websocket.receive":
            message[READ_AT] = self.read_at
        elif message["type"] == "websocket.connect":
            message[RECEIVED_AT] = self.received_at
            message[CLIENT_END] = self
        return cast(ASGIReceiveEvent, message)


__all__ = ["CLIENT_END", "READ_AT", "RealtimeWebSocketProtocol", "Take"]
