"""The gateway under uvicorn (uvloop + httptools): slow clients, connection limit, drain.

What stock uvicorn does not do, and the gateway needs in front of the internet (docs/spec.md
§4 ``[server]``, §13):

- ``client_header_timeout_s`` (nginx ``client_header_timeout``, Envoy
  ``request_headers_timeout``): a connection that has not sent a whole request head that long
  after it was accepted — or, on a kept-alive connection, after the next request's first byte —
  gets a 408 and is closed. Without it, a client that sends half a head and then nothing (or a
  byte at a time) holds a connection and a file descriptor for ever.
- ``client_body_timeout_s`` (nginx ``client_body_timeout``): more than that between two reads of
  a request body gets a 408 (OpenAI error shape) and the connection is closed. Time the
  gateway itself is not reading (flow control paused, or ``Expect: 100-continue`` not answered
  yet) never counts against the client. The request path sees the client go away (499).
- ``max_client_connections``: a connection beyond it gets a 503 (``Retry-After: 1``) and is
  closed at once, while the connections already open keep being served.
- SIGTERM is a graceful drain, not an error: stop accepting, let in-flight requests and
  streams finish within ``shutdown_grace_s`` (then cancel what is left), run the lifespan
  shutdown (pools closed, spans flushed), exit 0. Stock uvicorn re-raises SIGTERM after the
  drain, so the process ends -15 and a Kubernetes rollout logs every pod stop as a failure.
  With ``workers > 1`` uvicorn's supervisor forwards SIGTERM to each worker (each drains the
  same way) and exits 0 once they are done; it first closes its own copy of the listening
  socket, so the port stops accepting as soon as the workers close theirs.

:class:`GuardedHttpToolsProtocol` is the only place that knows about uvicorn's protocol
internals; it is small on purpose, so that other per-connection concerns can subclass it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import inspect
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import httptools
import uvicorn
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState
from uvicorn.supervisors.multiprocess import Multiprocess

from gateway.config import Config, is_loopback
from gateway.context import RECEIVED_AT
from gateway.deadline import Deadline
from gateway.errors import error_body
from gateway.realtime.server_protocol import RealtimeWebSocketProtocol
from gateway.types import ASGIApp

#: a worker that could not start (uvicorn's convention)
STARTUP_FAILURE = 3


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

    @classmethod
    def of(cls, config: Config) -> ClientLimits:
        s = config.server
        return cls(s.client_header_timeout_s, s.client_body_timeout_s, s.max_client_connections)


class GatewayUvicornConfig(uvicorn.Config):
    """uvicorn's config plus the client limits (pickled to each worker with it)."""

    def __init__(self, app: ASGIApp | str, limits: ClientLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.client_limits = limits
        #: ``gateway serve`` sets it: see :func:`freeze_startup_objects`
        self.freeze_gc = False


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


def _canned(status: bytes, code: str, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer with the OpenAI error shape, sent outside any request."""
    kind = _CANNED_TYPES.get(status[:3], "invalid_request_error")
    body = error_body(message, kind, code)
    retry = b"true" if kind == "service_unavailable" else b"false"
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n" + extra + b"connection: close\r\n"
        b"x-should-retry: " + retry + b"\r\n\r\n"
    ) + body


#: the OpenAI error type of each answer sent outside a request (the rest: invalid_request_error)
_CANNED_TYPES = {b"408": "request_timeout", b"503": "service_unavailable"}


class OneWrite:
    """The client transport as uvicorn's request cycle sees it: each response's head waits for
    the first body write of the same event-loop step and leaves with it, so a whole answer (and
    a stream's first event) is one ``write`` — one syscall instead of two, measured as the
    largest single cost per proxied request here. A head that no body write follows in that
    step (a passthrough awaiting its upstream, a HEAD answer) goes out when the step ends; a
    close writes it first. Order is kept: nothing is ever written past a held head."""

    __slots__ = ("_flush", "_held", "_loop", "_transport", "armed")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None
        #: hold the next write (set as each request's cycle begins: its first write is the head)
        self.armed = False

    def write(self, data: bytes) -> None:
        if self.armed:
            self.armed = False
            self._held = data
            self._flush = self._loop.call_soon(self.flush)
            return
        held = self._held
        if held is None:
            self._transport.write(data)
            return
        self._held = None
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._transport.writelines((held, data))

    def flush(self) -> None:
        held, self._held, self._flush = self._held, None, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class Awaiting(enum.Enum):
    """What a client connection owes the gateway next, as the guards see it::

        accept ──▶ HEAD ──head in──▶ BODY ──message complete──▶ NOTHING
                    ▲                                              │
                    └──────────── the next request's first byte ───┘

    One timer per connection serves all three (:class:`~gateway.deadline.Deadline`).
    """

    #: a request head: due ``client_header_timeout_s`` after the accept (a connection's first
    #: request) or after the request's first byte (a kept-alive connection's next one)
    HEAD = "head"
    #: the rest of the request body: no gap between two reads over ``client_body_timeout_s``
    #: (time the gateway is not reading never counts)
    BODY = "body"
    #: the request is read, or the connection is between requests (uvicorn's keep-alive
    #: timeout watches that)
    NOTHING = "nothing"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the client guards: header and body timeouts, and a
    connection limit. The guards' one :class:`~gateway.deadline.Deadline` per connection times
    what the client owes (:class:`Awaiting`); its timer is armed only when a read leaves a
    request head or body unfinished (and set again only when it fires early, never per chunk):
    a request that arrives in one read costs none.

    Two more things for the Timeline and the hot path (issue 15): the request's first byte read
    is stamped into the scope (:data:`gateway.context.RECEIVED_AT`), and each request's cycle
    writes through :class:`OneWrite`."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        gateway = config if isinstance(config, GatewayUvicornConfig) else None
        self.client_limits = ClientLimits() if gateway is None else gateway.client_limits
        self._freeze_gc = gateway is not None and gateway.freeze_gc
        self.awaiting = Awaiting.NOTHING
        self._guard = Deadline(self.loop, self.client_limits.header_timeout_s, self._guard_expired)
        self._out: OneWrite | None = None
        self._head_bytes = 0
        self._head_count = 0
        #: the whole answer to send instead of uvicorn's bare 400 when a guard refused the head
        self._refusal: bytes | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._freeze_gc:
            freeze_startup_objects()
        self._out = OneWrite(transport, self.loop)
        limits = self.client_limits
        if len(self.connections) > limits.max_connections:
            message = f"the gateway holds {limits.max_connections} client connections; retry"
            transport.write(
                _canned(b"503 Service Unavailable", "max_client_connections", message, _RETRY_1)
            )
            transport.close()
            return
        # a client that sends nothing at all: its head is due within the timeout of the accept
        self._expect(Awaiting.HEAD)
        self._guard.arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # a read that leaves a head or a body unfinished arms the guard's timer (if it is not):
        # a request that arrives whole in one read (nearly all of them) costs no timer at all
        self._guard.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.awaiting = Awaiting.NOTHING
        self._guard.stop()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        # httptools calls this from data_received on the request's first byte: that read is the
        # Timeline's ``received`` (docs/spec.md §6), before parsing, the ASGI task and queueing
        received = time.perf_counter()
        self._head_bytes = self._head_count = 0
        super().on_message_begin()
        self.scope[RECEIVED_AT] = received  # type: ignore[literal-required]
        if self.awaiting is Awaiting.NOTHING:  # a kept-alive connection's next request
            self._expect(Awaiting.HEAD)

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self.client_limits.max_head_bytes:
            self._refuse_head(b"414 URI Too Long", "uri_too_long", "the request target is too long")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.client_limits
        self._head_bytes += len(name) + len(value)
        self._head_count += 1
        if self._head_count > limits.max_headers or self._head_bytes > limits.max_head_bytes:
            self._refuse_head(
                b"431 Request Header Fields Too Large",
                "request_header_fields_too_large",
                f"the request head is over {limits.max_headers} headers or "
                f"{limits.max_head_bytes} bytes",
            )
        if b"\r" in value or b"\n" in value:
            # an obs-fold (RFC 9112 §5.2) or a bare CR/LF that a lenient parser let through: never
            # forwarded, where it would start a header line of its own upstream
            self._refuse_head(
                b"400 Bad Request", "invalid_header", "a header value holds a line break"
            )
        super().on_header(name, value)

    def _refuse_head(self, status: bytes, code: str, message: str) -> None:
        """Stop parsing this head: uvicorn answers a parser error with :meth:`send_400_response`,
        which sends ``status`` (OpenAI error shape) instead and closes."""
        self._refusal = _canned(status, code, message)
        raise httptools.HttpParserError(message)

    def send_400_response(self, msg: str) -> None:
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            super().send_400_response(msg)
            return
        if not self.transport.is_closing():
            self.transport.write(refusal)
            self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # a body may follow: the gaps between its reads are watched until message complete
        self._expect(Awaiting.BODY)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        # the cycle starts now (at once, or a pipelined one after the previous response): its
        # first write is its response head (or a 100 Continue), held by OneWrite
        out = self._out
        if out is not None:
            out.armed = True
            cycle.transport = out  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)

    def handle_websocket_upgrade(self) -> None:
        # the connection is the WebSocket protocol's from here on: the guards let go of it
        self._expect(Awaiting.NOTHING)
        super().handle_websocket_upgrade()

    def on_body(self, body: bytes) -> None:
        self._guard.touch()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._expect(Awaiting.NOTHING)
        super().on_message_complete()

    # ------------------------------------------------------------ the guards

    def _expect(self, what: Awaiting) -> None:
        """The guards' one transition: what the client owes next, from now. A timer armed for
        what it owed before is cancelled (it may be due too late for the new timeout)."""
        self.awaiting = what
        guard = self._guard
        guard.stop()
        if what is Awaiting.HEAD:
            guard.timeout = self.client_limits.header_timeout_s
            guard.begin()
        elif what is Awaiting.BODY:
            guard.timeout = self.client_limits.body_timeout_s
            guard.begin()

    def _guard_expired(self) -> None:
        """The guard's deadline passed: the client owed a head, or body bytes, that long."""
        if self.transport.is_closing():
            return
        timeout = self._guard.timeout
        if self.awaiting is Awaiting.HEAD:
            self._close_with_408(
                "client_header_timeout", f"the request head did not arrive within {timeout:g} s"
            )
            return
        cycle = self.cycle
        if cycle is None:
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            self._guard.start()  # the gateway is not reading: not the client's time
            return
        self._close_with_408(
            "client_body_timeout", f"no request body bytes arrived for {timeout:g} s"
        )

    def _close_with_408(self, code: str, message: str) -> None:
        self.awaiting = Awaiting.NOTHING
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_canned(b"408 Request Timeout", code, message))
        if cycle is not None and not cycle.response_complete:
            # the request path sees the client go away; nothing else is written here
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


_RETRY_1 = b"retry-after: 1\r\n"


class GatewayServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM is a drain that ends in exit status 0.

    uvicorn restores the previous handlers after the drain and raises every captured signal
    again; here SIGTERM is not raised again (it was handled: the drain is the handling), while
    SIGINT still is (Ctrl+C keeps the shell's convention).
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        if signal.SIGINT in self._captured_signals:
            signal.raise_signal(signal.SIGINT)


class Supervisor(Multiprocess):
    """uvicorn's multiprocess supervisor that stops listening as soon as it is told to stop."""

    def handle_term(self) -> None:
        self._stop_listening()
        super().handle_term()

    def handle_int(self) -> None:
        self._stop_listening()
        super().handle_int()

    def _stop_listening(self) -> None:
        # the workers hold the same listening socket: once they close theirs, nothing accepts
        for sock in self.sockets:
            sock.close()


def uvicorn_config(config: Config, app: ASGIApp | str, **overrides: Any) -> GatewayUvicornConfig:
    """The uvicorn config ``gateway serve`` runs with (tests pass ``port=`` and such)."""
    server = config.server
    options: dict[str, Any] = dict(
        host=server.host,
        port=server.port,
        loop="uvloop",
        http=GuardedHttpToolsProtocol,
        # GET /v1/realtime (docs/spec.md §19): websockets' sans-I/O protocol with socket stamps;
        # frames over [realtime] max_message_bytes close the session with 1009; no deflate
        ws=RealtimeWebSocketProtocol,
        ws_max_size=config.realtime.max_message_bytes,
        ws_per_message_deflate=False,
        lifespan="on",
        proxy_headers=False,  # the edge hop decides whom to trust (edge.trusted_proxies)
        server_header=False,
        access_log=False,  # the gateway writes its own access log
        # a float is fine: uvicorn hands it to asyncio.timeout(); 0 cancels at once
        timeout_graceful_shutdown=server.shutdown_grace_s,
        log_level=config.logging.level,
        backlog=4096,
    )
    options.update(overrides)
    return GatewayUvicornConfig(app, ClientLimits.of(config), **options)


#: the gateway's own lines (``serving on``, a port in use, the startup warnings), written in
#: ``[logging] format`` to stderr by the log config ``serve`` hands uvicorn
log = logging.getLogger("gateway")


def live_view_line(config: Config, address: str) -> str:
    """Where the live view is, or why it is off and how to turn it on (docs/spec.md §18)."""
    if config.ui.enabled:
        return f"gateway: live view on http://{address}{config.ui.path}"
    return (
        "gateway: live view off (it is on by default only when listening on loopback or with "
        '[auth] mode = "keys"); [ui] enabled = true turns it on'
    )


def exposure_warning(config: Config) -> str | None:
    """The startup warning of docs/spec.md §3: listening beyond loopback, no client keys asked
    for, and a backend that sends its own key — anyone who reaches the port spends it."""
    if is_loopback(config.server.host) or config.auth.mode != "off":
        return None
    keyed = [b.name for b in config.backends if b.api_key_env]
    if not keyed:
        return None
    names = ", ".join(keyed)
    sends = (
        f"backend {names} sends its own key"
        if len(keyed) == 1
        else f"backends {names} send their own keys"
    )
    return (
        f'gateway: warning: listening on {config.server.host} with [auth] mode = "off" while '
        f"{sends}: anyone who reaches the port spends {'it' if len(keyed) == 1 else 'them'}; "
        f'[auth] mode = "keys" closes it'
    )


def bind(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything else starts, as uvicorn binds one for its
    workers (SO_REUSEADDR, IPv6 for an address with a colon). The server listens on it once
    the app is up (``create_server(sock=…)``): until then a connection is refused, not queued
    behind a startup that may fail."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve(config: Config) -> int:
    """Run the gateway until SIGTERM (drained: 0) or SIGINT; workers > 1 under the supervisor.

    It says "serving on …" only once the socket is bound; an address that cannot be bound (in
    use, not this machine's, a privileged port) is one line naming it and exit status
    :data:`STARTUP_FAILURE` (docs/spec.md §3)."""
    from gateway.telemetry.logs import log_config

    server = config.server
    workers = server.workers > 1
    # every line the process (and each worker) writes in [logging] format (docs/spec.md §4)
    logs = log_config(config.logging)
    if workers:
        uv = uvicorn_config(
            config,
            "gateway.app:create_app",
            factory=True,
            workers=server.workers,
            log_config=logs,
        )
    else:
        from gateway.app import Gateway

        uv = uvicorn_config(config, Gateway(config), log_config=logs)
    logging.captureWarnings(True)  # py.warnings through the same handlers
    uv.freeze_gc = True
    warning = exposure_warning(config)
    if warning is not None:
        log.warning(warning)
    address = _address(server.host, server.port)
    try:
        sock = bind(server.host, server.port)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        log.error(f"gateway: cannot listen on {address}: {reason}")
        return STARTUP_FAILURE
    with sock:
        log.info(f"gateway: serving on http://{address} (config: {config.source})")
        log.info(live_view_line(config, address))
        if workers:
            return _serve_workers(uv, sock)
        gateway_server = GatewayServer(uv)
        gateway_server.run(sockets=[sock])
        return 0 if gateway_server.started else STARTUP_FAILURE


def _supervisor(uv: GatewayUvicornConfig, sock: socket.socket) -> Supervisor:
    # uvicorn before 0.5x takes the worker's entry point (``target``); later ones build it
    if "target" in inspect.signature(Multiprocess.__init__).parameters:
        make: Any = Supervisor
        return cast(Supervisor, make(uv, target=uvicorn.Server(config=uv).run, sockets=[sock]))
    return Supervisor(uv, sockets=[sock])


def _serve_workers(uv: GatewayUvicornConfig, sock: socket.socket) -> int:
    from gateway.telemetry.metrics import METRICS_DIR_ENV

    # the workers' metrics snapshots, merged by whichever worker answers /metrics
    with tempfile.TemporaryDirectory(prefix="gateway-metrics-") as shared:
        os.environ[METRICS_DIR_ENV] = shared
        supervisor = _supervisor(uv, sock)
        supervisor.run()
    failed = any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    return STARTUP_FAILURE if failed else 0


__all__ = [
    "Awaiting",
    "ClientLimits",
    "GatewayServer",
    "GatewayUvicornConfig",
    "GuardedHttpToolsProtocol",
    "Supervisor",
    "bind",
    "exposure_warning",
    "serve",
    "uvicorn_config",
]
