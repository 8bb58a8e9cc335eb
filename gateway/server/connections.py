"""The protocol an accepted connection is served by: the one place the server chooses it.

Every connection is plain-text HTTP/1.1 (:class:`~gateway.server.http1.Http1Protocol`), which
hands a WebSocket upgrade on to :class:`~gateway.server.websocket.RealtimeWebSocketProtocol`.
TLS and HTTP/2 are chosen here, and nowhere else: :class:`~gateway.server.process.Server` asks
this module for the factory of its listening socket, and the drain knows a connection only as
:class:`~gateway.server.state.Served` (registered in ``ServerState.connections``, answering
``shutdown()``), whichever protocol serves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.server.http1 import Http1Protocol
from gateway.server.state import ServerState


def protocol_factory(
    state: ServerState, loop: asyncio.AbstractEventLoop
) -> Callable[[], asyncio.Protocol]:
    """What ``loop.create_server`` builds per accepted socket: an HTTP/1.1 connection sharing
    ``state``."""
    return lambda: Http1Protocol(state, loop)


__all__ = ["protocol_factory"]
