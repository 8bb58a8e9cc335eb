"""The gateway under uvicorn's server: slow clients, connection limit, drain.

uvicorn runs the process — lifespan, signals, the drain, ``--workers`` — through its public
``Config``/``Server``; each client connection is the gateway's own HTTP/1.1 protocol,
:class:`gateway.http1.Http1Protocol` (``Config(http=…)``), which holds the client guards.

What the gateway needs in front of the internet (docs/spec.md
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

What still leans on uvicorn beyond its public API (hence the pin in pyproject.toml):
:class:`GatewayServer` reads the signals it captured, :class:`Supervisor` hooks the
supervisor's signal handlers. (The realtime WebSocket protocol,
``gateway/realtime/server_protocol.py``, is the gateway's own on ``websockets``' sans-I/O API:
``ws=`` below only switches upgrades on, for :class:`Http1Protocol` to hand them over.)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from typing import Any, cast

import uvicorn
from uvicorn.supervisors.multiprocess import Multiprocess

from gateway.config import Config, is_loopback
from gateway.http1 import Awaiting, ClientLimits, Http1Protocol
from gateway.realtime.server_protocol import RealtimeWebSocketProtocol
from gateway.types import ASGIApp

#: a worker that could not start (uvicorn's convention)
STARTUP_FAILURE = 3


def client_limits(config: Config) -> ClientLimits:
    """The ``[server]`` guards of ``config``."""
    s = config.server
    return ClientLimits(
        s.client_header_timeout_s, s.client_body_timeout_s, s.max_client_connections
    )


class GatewayUvicornConfig(uvicorn.Config):
    """uvicorn's config plus the client limits (pickled to each worker with it)."""

    def __init__(self, app: ASGIApp | str, limits: ClientLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.client_limits = limits
        #: ``gateway serve`` sets it: see :func:`gateway.http1.freeze_startup_objects`
        self.freeze_gc = False


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
        http=Http1Protocol,  # gateway/http1.py: the edge of our own
        # GET /v1/realtime (docs/spec.md §19): Http1Protocol hands upgrades to this protocol
        # (its own, on websockets' sans-I/O API; uvicorn never builds it); messages over
        # [realtime] max_message_bytes close the session with 1009; deflate is never offered
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
    return GatewayUvicornConfig(app, client_limits(config), **options)


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
    "Http1Protocol",
    "Supervisor",
    "bind",
    "exposure_warning",
    "serve",
    "uvicorn_config",
]
