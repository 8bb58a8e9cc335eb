"""The gateway's own server: the lifespan, the listening socket, signals, the SIGTERM drain.

No third-party server runs the process. :func:`serve` binds the socket, then (``workers = 1``)
runs :class:`Server` in this process, or (``workers > 1``) hands the socket to
:class:`gateway.server.supervisor.Supervisor`, whose worker processes
(:mod:`gateway.server.worker`) each run a :class:`Server` on it. A :class:`Server` is one uvloop
event loop:

    bind ─▶ lifespan startup ─▶ create_server(sock) ─▶ … serving … ─▶ SIGTERM
         ─▶ stop accepting ─▶ each connection's shutdown() ─▶ wait (≤ shutdown_grace_s)
         ─▶ cancel what is left ─▶ lifespan shutdown ─▶ exit 0

Each client connection is served by the protocol :mod:`gateway.server.connections` picks
(HTTP/1.1: :class:`gateway.server.http1.Http1Protocol`; with ``[server.tls]`` or ``h2c``, HTTP/2:
:class:`gateway.server.http2.Http2Protocol`), built with the
:class:`~gateway.server.state.ServerState` all connections of the process share. Nothing runs
per request here: the one timer of the server sets the ``date`` line again each second.

What the gateway needs in front of the internet (docs/spec.md §4 ``[server]``, §13):

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
- the socket is bound first and listens only once the app is up: until then a connection is
  refused, not queued behind a startup that may fail (which exits :data:`STARTUP_FAILURE`).
- ``[admin] listen`` (docs/spec.md §28): a second socket, bound with the first (before
  "serving on"; one that cannot be bound exits :data:`STARTUP_FAILURE` too), served by the
  same :class:`Server` with its own state and app (:func:`admin_listeners`), listening,
  closed and drained with the first.
- SIGTERM is a graceful drain, not an error: stop accepting, let in-flight requests and
  streams finish within ``shutdown_grace_s`` (then cancel what is left), run the lifespan
  shutdown (pools closed, spans flushed), exit 0 — a Kubernetes rollout logs a pod stop as a
  success. SIGINT drains the same way and then ends the process by SIGINT (the shell's
  convention for Ctrl+C); a second SIGINT during the drain cancels what is left at once.
- SIGHUP runs the reload hooks (:func:`on_reload`), one after the other, on the loop: the
  config file read again (docs/spec.md §29) and, with ``[server.tls]``, the certificate
  (:func:`reload_certificates`, docs/spec.md §27); no connection is touched, open ones keep
  their certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from gateway.config import Config, is_loopback
from gateway.server.connections import protocol_factory
from gateway.server.state import (
    ServerState,
    date_line,
    listener_state,
    origin_policy,
    server_state,
)
from gateway.server.supervisor import STARTUP_FAILURE, Supervisor
from gateway.server.tls import ServerTls, TlsError
from gateway.types import ASGIApp

#: the listen backlog (the kernel caps it at net.core.somaxconn)
BACKLOG = 4096

#: a bound socket and the state its connections share
Listener = tuple[ServerState, socket.socket]

#: the gateway's own lines (``serving on``, a port in use, the startup warnings, the lifespan
#: and the drain), written in ``[logging] format`` to stderr (:func:`serve` applies the config)
log = logging.getLogger("gateway")


class Lifespan:
    """The ASGI lifespan protocol against the app: ``startup`` → ``lifespan.startup.complete``
    (True) or ``.failed`` / an exception (False); ``shutdown`` → ``lifespan.shutdown.complete``.
    An app that returns without answering does not use the lifespan: it starts."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._started: asyncio.Future[bool] | None = None
        self._stopped: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> bool:
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        self._stopped = loop.create_future()
        self._task = loop.create_task(self._main())
        await self._inbox.put({"type": "lifespan.startup"})
        return await self._started

    async def shutdown(self) -> None:
        if self._task is None or self._stopped is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._stopped

    async def _main(self) -> None:
        scope = {
            "type": "lifespan",
            "asgi": {"version": "3.0", "spec_version": "2.0"},
            "state": self.state,
        }
        ok = True
        try:
            await self.app(scope, self._inbox.get, self._send)
        except BaseException as exc:
            ok = False
            log.error("gateway: exception in the lifespan protocol", exc_info=exc)
        finally:
            for done in (self._started, self._stopped):
                if done is not None and not done.done():
                    done.set_result(ok)

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind.endswith(".failed") and message.get("message"):
            log.error(f"gateway: {kind}: {message['message']}")
        if kind.startswith("lifespan.startup.") and self._started and not self._started.done():
            self._started.set_result(kind == "lifespan.startup.complete")
        elif kind.startswith("lifespan.shutdown.") and self._stopped and not self._stopped.done():
            self._stopped.set_result(kind == "lifespan.shutdown.complete")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - no uvloop on Windows
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class Server:
    """One process's server on a bound socket (see the module). :meth:`run` blocks until
    :meth:`stop`, SIGTERM or SIGINT (signals only in the main thread: a server in another
    thread, as tests run it, is stopped by :meth:`stop`) or, with ``parent_fd``, the end of
    the supervisor that started this worker (its pipe closes). ``listeners`` are more bound
    sockets, each served with its own state (:func:`admin_listeners`): they listen, stop
    accepting and drain with the main one."""

    def __init__(
        self,
        state: ServerState,
        sock: socket.socket,
        grace_s: float,
        *,
        parent_fd: int | None = None,
        listeners: Sequence[Listener] = (),
    ) -> None:
        self.state = state
        self.sock = sock
        self.listeners: tuple[Listener, ...] = ((state, sock), *listeners)
        self.grace_s = grace_s
        self.parent_fd = parent_fd
        #: the app is up and the socket listening
        self.started = False
        #: the signals that came, in order (a first SIGINT: :func:`end_by_sigint` after run)
        self.signals: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_early = False
        self._forced = False
        self._clock: asyncio.TimerHandle | None = None
        self._reloading: asyncio.Task[None] | None = None
        self._reload_again = False

    @property
    def interrupted(self) -> bool:
        """The first signal was SIGINT (the process should end by it once drained)."""
        return bool(self.signals) and self.signals[0] == signal.SIGINT

    def run(self) -> int:
        """Serve until stopped: 0, or :data:`STARTUP_FAILURE`."""
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(self.serve())

    def stop(self) -> None:
        """A graceful drain, as SIGTERM (from any thread)."""
        loop, stop = self._loop, self._stop
        if loop is None or stop is None:
            self._stop_early = True
            return
        loop.call_soon_threadsafe(stop.set)

    async def serve(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_early:
            self._stop.set()
        handled = self._handle_signals(loop)
        if self.parent_fd is not None:
            loop.add_reader(self.parent_fd, self._parent_gone)
        try:
            return await self._serve(loop)
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
            if self.parent_fd is not None:
                loop.remove_reader(self.parent_fd)
            if self._clock is not None:
                self._clock.cancel()

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> int:
        assert self._stop is not None
        state = self.state
        lifespan = Lifespan(state.app, state.lifespan_state)
        if not await lifespan.startup():
            log.error("gateway: application startup failed; exiting")
            return STARTUP_FAILURE
        log.info(f"gateway: application startup complete (process {os.getpid()})")
        release_sighup()  # a reload asked while it started runs now, on what it started with
        if not self._stop.is_set():  # not stopped while it started: listen
            servers = [await _listen(loop, *listener) for listener in self.listeners]
            self._tick()
            self.started = True
            await self._stop.wait()
            for server in servers:  # stop accepting: a port refuses once no process listens
                server.close()
            await self._drain(loop)
        if not self._forced:
            await lifespan.shutdown()
        log.info(f"gateway: application shutdown complete (process {os.getpid()})")
        return 0

    async def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Each connection's ``shutdown()`` (idle ones close, busy ones after their answer),
        then wait for connections and request tasks within the grace; cancel what is left."""
        state = self.state
        for conn in list(state.connections):
            conn.shutdown()
        deadline = loop.time() + self.grace_s
        # polled (as uvicorn does), only while draining: the request path notifies nothing
        while (state.connections or state.tasks) and not self._forced and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        left = list(state.tasks)
        if left:
            why = "a second SIGINT" if self._forced else "shutdown_grace_s is over"
            log.error(f"gateway: {why}: cancelling {len(left)} request(s) still running")
            for task in left:
                task.cancel()
            await asyncio.wait(left, timeout=1.0)
        for conn in list(state.connections):
            conn.transport.close()  # registered in connection_made: it has one

    def _tick(self) -> None:
        """The ``date`` line, set again at each second's turn (one timer per process)."""
        assert self._loop is not None
        now = time.time()
        date = date_line(now)
        for state, _ in self.listeners:
            state.date = date
        self._clock = self._loop.call_later(1.0 - now % 1.0, self._tick)

    def _handle_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        handled: list[int] = [signal.SIGTERM, signal.SIGINT]
        for sig in handled:
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        return [*handled, signal.SIGHUP]

    def reload(self) -> None:
        """SIGHUP: run the reload hooks (a reload asked while one runs runs once more after)."""
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True
            return
        assert self._loop is not None
        self._reloading = self._loop.create_task(self._run_reload_hooks())

    async def _run_reload_hooks(self) -> None:
        while True:
            self._reload_again = False
            for hook in list(self.state.reload_hooks):
                try:
                    await hook()
                except Exception:
                    log.exception("gateway: a reload hook failed")
            if not self._reload_again:
                return

    def _on_signal(self, sig: int) -> None:
        assert self._stop is not None
        if self._stop.is_set() and sig == signal.SIGINT:
            self._forced = True  # a second Ctrl+C: cancel what is left now
        self.signals.append(sig)
        self._stop.set()

    def _parent_gone(self) -> None:
        """The supervisor's end of the pipe closed (it is gone): drain, as on SIGTERM."""
        assert self._loop is not None and self._stop is not None and self.parent_fd is not None
        self._loop.remove_reader(self.parent_fd)
        self._stop.set()


async def _listen(
    loop: asyncio.AbstractEventLoop, state: ServerState, sock: socket.socket
) -> asyncio.Server:
    """Listen on a bound socket, each connection served by the protocol ``state`` picks."""
    tls = state.tls
    return await loop.create_server(
        protocol_factory(state, loop),
        sock=sock,
        backlog=BACKLOG,
        ssl=tls.context if tls is not None else None,
        # a handshake is part of the head the client owes; a client that never answers the TLS
        # close is cut as a lingering close is (docs/spec.md §27)
        ssl_handshake_timeout=state.limits.header_timeout_s if tls is not None else None,
        ssl_shutdown_timeout=state.limits.linger_s if tls is not None else None,
    )


def admin_listeners(state: ServerState, app: Any, sock: socket.socket | None) -> list[Listener]:
    """The admin API's own listener (``[admin] listen``, docs/spec.md §28) on its bound
    socket, served by the app's :attr:`~gateway.app.Gateway.admin_listener` (the admin API,
    ``/healthz``, ``/readyz``); none without a socket. Which listener a request came on is
    which app the server hands it to: nothing is looked at per request."""
    if sock is None:
        return []
    return [(listener_state(state, app.admin_listener), sock)]


def on_reload(state: ServerState, app: Any) -> None:
    """The one place SIGHUP's work is registered (docs/spec.md §29): the app re-reads its
    config file; the Origin policy follows the MCP servers it now lists. Whatever else re-reads
    something on SIGHUP adds its hook to ``state.reload_hooks`` here."""

    async def reload_config() -> None:
        if await app.reload():
            state.origins = origin_policy(app.config)

    state.reload_hooks.append(reload_config)
    if state.tls is not None:

        async def reload_tls() -> None:
            reload_certificates(state)

        state.reload_hooks.append(reload_tls)


def reload_certificates(state: ServerState) -> None:
    """SIGHUP with ``[server.tls]``: the certificate, its key and the client CA are read again
    from their files; handshakes from now on get them, connections already open keep theirs
    (none is dropped). Files that cannot be used leave the old ones in place (docs/spec.md
    §27)."""
    tls = state.tls
    if tls is None:
        return
    error = tls.reload()
    if error is None:
        log.info(f"gateway: SIGHUP: TLS certificate re-read from {tls.cfg.cert_file}")
    else:
        log.error(f"gateway: SIGHUP: the TLS certificate was not replaced: {error}")


def write_pid_file(path: str | None) -> Callable[[], None]:
    """``[server] pid_file``: this process's id, for ``gateway reload``; what removes it."""
    if path is None:
        return lambda: None
    with open(path, "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    return lambda: _remove(path)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def end_by_sigint() -> None:
    """End the process by SIGINT (after a drain that SIGINT started): the shell sees Ctrl+C."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.raise_signal(signal.SIGINT)


def serving_line(config: Config, address: str) -> str:
    """The address served and its protocols: ``https://127.0.0.1:8443 (h2, http/1.1)``."""
    s = config.server
    h2 = s.http2.enabled
    if s.tls is not None:
        return f"https://{address} ({'h2, ' if h2 else ''}http/1.1)"
    return f"http://{address} ({'http/1.1, h2c' if s.h2c and h2 else 'http/1.1'})"


def live_view_line(config: Config, address: str) -> str:
    """Where the live view is, or why it is off and how to turn it on (docs/spec.md §18)."""
    if config.ui.enabled:
        scheme = "https" if config.server.tls is not None else "http"
        return f"gateway: live view on {scheme}://{address}{config.ui.path}"
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
    """The server's socket, bound before anything else starts (SO_REUSEADDR, IPv6 for an
    address with a colon; inheritable, for the workers). The server listens on it once the app
    is up (``create_server(sock=…)``): until then a connection is refused, not queued behind a
    startup that may fail."""
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


def configure_logging(config: Config) -> None:
    """Every line the process writes in ``[logging] format`` (docs/spec.md §4), warnings too."""
    import logging.config

    from gateway.telemetry.logs import log_config

    logging.config.dictConfig(log_config(config.logging))
    logging.captureWarnings(True)  # py.warnings through the same handlers


def hold_sighup() -> None:
    """Block SIGHUP in this thread until :func:`release_sighup` (a reload asked meanwhile stays
    pending: the kernel keeps one)."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


def release_sighup() -> None:
    """Unblock SIGHUP: the loop's handler (installed by :meth:`Server.run`) takes a pending one."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


def serve(config: Config) -> int:
    """Run the gateway until SIGTERM (drained: 0) or SIGINT; workers > 1 under the supervisor.

    It says "serving on …" only once the socket (and ``[admin] listen``'s) is bound; an address
    that cannot be bound (in use, not this machine's, a privileged port) is one line naming it
    and exit status :data:`STARTUP_FAILURE` (docs/spec.md §3)."""
    server = config.server
    hold_sighup()  # until the server's handler: never a stop, never lost
    configure_logging(config)
    warning = exposure_warning(config)
    if warning is not None:
        log.warning(warning)
    if server.tls is not None:  # each worker reads the files again: they are checked here once
        try:
            ServerTls(server.tls, ())
        except TlsError as exc:
            log.error(f"gateway: cannot serve TLS: {exc}")
            return STARTUP_FAILURE
    bound = _bind_listeners(config)
    if bound is None:
        return STARTUP_FAILURE
    sock, admin_sock = bound
    address = _address(server.host, server.port)
    remove_pid_file = write_pid_file(server.pid_file)
    with sock, admin_sock if admin_sock is not None else contextlib.nullcontext():
        log.info(f"gateway: serving on {serving_line(config, address)} (config: {config.source})")
        log.info(live_view_line(config, address))
        if admin_sock is not None:
            log.info(admin_line(config))
        try:
            if server.workers > 1:
                return Supervisor(sock, server.workers, admin_sock=admin_sock).run()
            from gateway.app import Gateway

            app = Gateway(config)
            state = server_state(config, app, freeze_gc=True)
            on_reload(state, app)
            listeners = admin_listeners(state, app, admin_sock)
            runner = Server(state, sock, server.shutdown_grace_s, listeners=listeners)
            status = runner.run()
        finally:
            remove_pid_file()
    if runner.interrupted:
        end_by_sigint()
    return status


def _bind_listeners(config: Config) -> tuple[socket.socket, socket.socket | None] | None:
    """The gateway's socket and, with ``[admin] listen``, the admin API's (docs/spec.md §28);
    None when one cannot be bound (one error line names it; nothing stays bound)."""
    server = config.server
    sock = _bind_or_say(server.host, server.port, "")
    admin = config.admin.address()
    if sock is None or admin is None:
        return None if sock is None else (sock, None)
    admin_sock = _bind_or_say(*admin, " ([admin] listen)")
    if admin_sock is None:
        sock.close()
        return None
    return sock, admin_sock


def _bind_or_say(host: str, port: int, what: str) -> socket.socket | None:
    try:
        return bind(host, port)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        log.error(f"gateway: cannot listen on {_address(host, port)}{what}: {reason}")
        return None


def admin_line(config: Config) -> str:
    """Where the admin API's own listener serves it (``[admin] listen``, docs/spec.md §28)."""
    address = config.admin.address()
    assert address is not None
    scheme = "https" if config.server.tls is not None else "http"
    return (
        f"gateway: admin API on {scheme}://{_address(*address)}/admin/v1/ ([admin] listen; "
        "not served on the gateway's port)"
    )


__all__ = [
    "BACKLOG",
    "STARTUP_FAILURE",
    "Lifespan",
    "Listener",
    "Server",
    "admin_line",
    "admin_listeners",
    "bind",
    "configure_logging",
    "end_by_sigint",
    "exposure_warning",
    "live_view_line",
    "on_reload",
    "reload_certificates",
    "serve",
    "serving_line",
    "write_pid_file",
]
