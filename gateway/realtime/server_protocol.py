"""The client side of a realtime session: uvicorn's WebSocket protocol with socket stamps.

uvicorn serves the upgrade (``GET /v1/realtime`` with ``Upgrade: websocket``) with
``websockets``' sans-I/O protocol (:class:`~uvicorn.protocols.websockets.websockets_sansio_impl.
WebSocketsSansIOProtocol`): the frames are parsed, masked and written by ``websockets``, never by
the gateway. This subclass only adds the two socket times the Timeline needs (docs/spec.md §6,
§19), as keys of the ASGI messages the app receives:

- :data:`~gateway.context.RECEIVED_AT` on ``websocket.connect``: the upgrade request's first
  byte, as the HTTP protocol stamped it (the upgrade comes from uvicorn's httptools protocol,
  which is still the transport's protocol while this one is being connected), else the moment
  the upgrade was handed over;
- :data:`READ_AT` on each ``websocket.receive``: when the read that completed the message
  happened. The stamp of the last read is exact for every message the app receives: uvicorn
  pauses reading as soon as a message is queued and resumes only once the app has taken every
  queued message, so no later read can happen before the app has the message.

Why ``websockets`` rather than ``wsproto`` (both are maintained, both work under uvicorn): the
same library is the upstream client (:mod:`gateway.realtime.upstream`), its frame masking and
UTF-8 checks run in C (``websockets.speedups``), and uvicorn's sans-I/O protocol keeps the
``websocket.http.response`` extension the gateway answers refusals with (401, 404, 502 ... as
HTTP, never an accepted socket closed at once). Per-message deflate is off on both hops: a relay
would inflate and deflate every frame (``loadtests/realtime.py`` measures the per-frame cost).
"""

from __future__ import annotations

import time
from typing import Any, cast

from uvicorn._types import ASGIReceiveEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.context import RECEIVED_AT

#: the key of ``time.perf_counter()`` of the read that completed a ``websocket.receive``
READ_AT = "gateway.read_at"


class RealtimeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, stamping socket reads (see the module)."""

    read_at = 0.0
    received_at = 0.0

    def connection_made(self, transport: Any) -> None:
        # the upgrading HTTP protocol is still the transport's: its scope has the socket stamp
        upgraded = getattr(transport.get_protocol(), "scope", None)
        stamp = upgraded.get(RECEIVED_AT) if isinstance(upgraded, dict) else None
        self.received_at = stamp if isinstance(stamp, float) else time.perf_counter()
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        super().data_received(data)

    async def receive(self) -> ASGIReceiveEvent:
        message = cast(dict[str, Any], await super().receive())
        if message["type"] == "websocket.receive":
            message[READ_AT] = self.read_at
        elif message["type"] == "websocket.connect":
            message[RECEIVED_AT] = self.received_at
        return cast(ASGIReceiveEvent, message)


__all__ = ["READ_AT", "RealtimeWebSocketProtocol"]
