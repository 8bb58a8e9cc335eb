"""The server's end of a client's WebSocket connection, as a realtime session uses it.

The gateway's own server protocol (:class:`gateway.server.websocket.RealtimeWebSocketProtocol`)
is a :class:`ClientEnd` and offers itself in ``websocket.connect`` under :data:`CLIENT_END`: the
session registers its relay's direct path (:attr:`ClientEnd.relay`) and its drain
(:attr:`ClientEnd.drain`) there, and the relay writes to the client through
:meth:`ClientEnd.write`. Under another ASGI server there is no such key, and the session relays
every message through ASGI ``receive``/``send``. The server imports this module, never the
other way: realtime sits below the server in the import layers (``.importlinter``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.types import Message

#: the key of ``time.perf_counter()`` of the read that completed a ``websocket.receive``
READ_AT = "gateway.read_at"
#: the key of the server's own end of the connection in ``websocket.connect``: the protocol
#: offers itself, and a session registers its relay's direct path (:attr:`ClientEnd.relay`) and
#: its drain (:attr:`ClientEnd.drain`) there — no probing of ``receive.__self__``
CLIENT_END = "gateway.client_end"

#: the relay's hook: (message, is text, read at) -> True when it took (wrote) the message
Take = Callable[[bytes, bool, float], bool]


class ClientEnd:
    """What a session sees of the server's end of its client connection (see the module)."""

    #: the relay offered each whole message read (None: every message goes to ``receive()``)
    relay: Take | None = None
    #: the session's drain, while it relays: called when the server shuts down, instead of
    #: closing at once (docs/spec.md §13: a drain, as for streams)
    drain: Callable[[], None] | None = None
    #: the messages read and not yet taken by ``receive()``
    queue: asyncio.Queue[Message]

    def write(self, data: bytes, text: bool) -> bool:
        """One message to the client as one frame, now; False when the connection is not open
        or its write buffer is over the high-water mark (nothing written then)."""
        raise NotImplementedError


__all__ = ["CLIENT_END", "READ_AT", "ClientEnd", "Take"]
