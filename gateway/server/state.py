"""What every connection of one serving process shares, and how it is built from the config.

One :class:`ServerState` per process: the app and its lifespan state, the client guards
(:class:`ClientLimits`, docs/spec.md §4 ``[server]``), the keep-alive wait, the WebSocket
settings, the Origin policy, the open connections and running request tasks the drain waits for,
and the ``date`` line every answer carries. :class:`~gateway.server.process.Server` sets that
line again at each second's turn: nothing here is computed per request.

Every protocol the server runs on a connection (:mod:`gateway.server.connections` picks it)
registers in :attr:`ServerState.connections` while it is open and answers :class:`Served`:
that is all the drain knows of it.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Protocol

from gateway.config import Config, Http2Config
from gateway.origins import OriginPolicy
from gateway.server.tls import ALPN_H2, ALPN_HTTP1, ServerTls
from gateway.types import ASGIApp

#: an idle kept-alive client connection is closed after this long (uvicorn's default, kept)
KEEP_ALIVE_S = 5.0


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The ``[server]`` guards against slow and too many clients (docs/spec.md §4)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 10_000
    #: a request head's size (request line + headers) and header count (Envoy's defaults: 60 KiB
    #: and 100; nginx's 4 x 8 KiB): beyond them, 431 and the connection is closed
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    #: a connection answered early is closed after at most this long
    #: (:class:`~gateway.server.intake.Lingering`)
    linger_s: float = 2.0


class Served(Protocol):
    """A connection as the drain sees it, whichever protocol serves it."""

    transport: asyncio.Transport

    def shutdown(self) -> None:
        """The server stops: close when idle, else once what is in flight is done."""


def date_line(now: float | None = None) -> bytes:
    """The ``date`` header line of an answer (RFC 9110 §6.6.1) at ``now`` (default: now)."""
    return b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"


class ServerState:
    """What every connection of one server shares (see the module)."""

    def __init__(
        self,
        app: Any,
        *,
        lifespan_state: dict[str, Any] | None = None,
        limits: ClientLimits | None = None,
        keep_alive_s: float = KEEP_ALIVE_S,
        freeze_gc: bool = False,
        ws_enabled: bool = False,
        ws_max_size: int = 16 * 1024 * 1024,
        origins: OriginPolicy | None = None,
        tls: ServerTls | None = None,
        http2: Http2Config | None = None,
        h2c: bool = False,
    ) -> None:
        self.app = app
        #: the lifespan state (ASGI ``scope["state"]``): each request gets a shallow copy
        self.lifespan_state: dict[str, Any] = {} if lifespan_state is None else lifespan_state
        self.limits = limits or ClientLimits()
        #: an idle kept-alive connection is closed after this long
        self.keep_alive_s = keep_alive_s
        #: see :func:`freeze_startup_objects` (``gateway serve`` sets it)
        self.freeze_gc = freeze_gc
        #: WebSocket upgrades are served (else an upgrade is answered as plain HTTP)
        self.ws_enabled = ws_enabled
        #: a WebSocket message over this many bytes closes the session (1009)
        self.ws_max_size = ws_max_size
        #: ``[server] allowed_origins`` (docs/spec.md §25)
        self.origins = origins or OriginPolicy(None)
        #: ``[server.tls]``: the listening context (None: plain TCP)
        self.tls = tls
        #: ``[server.http2]`` when HTTP/2 is served (over TLS by ALPN; in clear with ``h2c``)
        self.http2 = http2
        #: cleartext HTTP/2 by prior knowledge beside HTTP/1.1 (docs/spec.md §27)
        self.h2c = h2c and http2 is not None
        #: the open connections and the running request tasks (what the drain waits for)
        self.connections: set[Served] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.total_requests = 0
        self.date = date_line()
        #: what SIGHUP runs, one after the other (:func:`gateway.server.process.on_reload`)
        self.reload_hooks: list[Callable[[], Awaitable[None]]] = []


def server_state(config: Config, app: ASGIApp, *, freeze_gc: bool = False) -> ServerState:
    """What the connections of a gateway process share: the app, the ``[server]`` guards,
    WebSocket upgrades (``GET /v1/realtime``, docs/spec.md §19) with frames over ``[realtime]
    max_message_bytes`` closing the session (1009), the Origin policy (docs/spec.md §25), TLS
    and HTTP/2 (docs/spec.md §27; a ``[server.tls]`` file that cannot be read raises
    :class:`~gateway.server.tls.TlsError`)."""
    s = config.server
    http2 = s.http2 if s.http2.enabled else None
    tls = None
    if s.tls is not None:
        tls = ServerTls(s.tls, (ALPN_H2, ALPN_HTTP1) if http2 is not None else (ALPN_HTTP1,))
    return ServerState(
        app,
        limits=client_limits(config),
        freeze_gc=freeze_gc,
        ws_enabled=True,
        ws_max_size=config.realtime.max_message_bytes,
        origins=origin_policy(config),
        tls=tls,
        http2=http2,
        h2c=s.h2c,
    )


def listener_state(state: ServerState, app: ASGIApp) -> ServerState:
    """The state of a second listening socket of the process (``[admin] listen``, docs/spec.md
    §28), served by its own ``app``. The rest is ``state``'s: the client guards, TLS and HTTP/2,
    the lifespan state, and the very sets of open connections and request tasks — so the drain
    waits for both listeners' and ``max_client_connections`` counts them together. No WebSocket
    upgrade there (one is answered as plain HTTP); SIGHUP's hooks stay on ``state``."""
    other = ServerState(
        app,
        lifespan_state=state.lifespan_state,
        limits=state.limits,
        keep_alive_s=state.keep_alive_s,
        freeze_gc=state.freeze_gc,
        origins=state.origins,
        tls=state.tls,
        http2=state.http2,
        h2c=state.h2c,
    )
    other.connections = state.connections
    other.tasks = state.tasks
    return other


def client_limits(config: Config) -> ClientLimits:
    """The ``[server]`` guards of ``config``."""
    s = config.server
    return ClientLimits(
        s.client_header_timeout_s, s.client_body_timeout_s, s.max_client_connections
    )


def origin_policy(config: Config) -> OriginPolicy:
    """``[server] allowed_origins``, with the origins ``[[mcp_servers]]`` list for ``/mcp``
    (docs/spec.md §25)."""
    mcp = [origin for server in config.mcp_servers for origin in server.allowed_origins]
    return OriginPolicy(config.server.allowed_origins, mcp)


_frozen = False


def freeze_startup_objects() -> None:
    """``gc.freeze()`` once per process, when the first client connects (the app is built by
    then): the startup objects (modules, config, pools, the runtime) leave the collector's
    generations, so its periodic full collections stop walking them — measured at several per
    cent of the CPU under load here (more with streams, whose relay allocates per event).
    Objects are still freed by reference counting; only cycles among startup objects are never
    collected, and startup makes none that matter."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


class WriteFlow:
    """The write side's backpressure of a connection's protocol (HTTP/1.1 and HTTP/2 alike):
    asyncio's ``pause_writing``/``resume_writing``, and :meth:`drain` for a writer to wait on
    until the transport's buffer is under its low-water mark. ``connection_lost`` calls
    ``resume_writing`` so no writer waits on a client that is gone. First among the bases:
    ``asyncio.BaseProtocol``'s own methods of those names do nothing."""

    loop: asyncio.AbstractEventLoop
    write_paused = False
    _drained: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        """Until the transport's buffer is under its low-water mark (or the client is gone)."""
        if self._drained is None:
            self._drained = self.loop.create_future()
        await asyncio.shield(self._drained)


__all__ = [
    "KEEP_ALIVE_S",
    "ClientLimits",
    "Served",
    "ServerState",
    "WriteFlow",
    "client_limits",
    "date_line",
    "freeze_startup_objects",
    "listener_state",
    "origin_policy",
    "server_state",
]
