"""The gateway under uvicorn (uvloop + httptools): slow clients, connection limit, drain.

What stock uvicorn does not do, and the gateway needs in front of the internet (SPEC §4
``[server]``, §13):

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
import gc
import inspect
import os
import signal
import socket
import sys
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

from gateway.config import Config
from gateway.context import RECEIVED_AT
from gateway.errors import error_body
from gateway.types import ASGIApp

#: a worker that could not start (uvicorn's convention)
STARTUP_FAILURE = 3


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The ``[server]`` guards against slow and too many clients (SPEC §4)."""

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


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the client guards: header and body timeouts, and a
    connection limit. Timers are plain ``call_at`` handles, armed only when a read leaves a
    request head or body unfinished (re-armed only when one fires early, never per chunk): a
    request that arrives in one read costs none.

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
        self.client_limits: ClientLimits = getattr(config, "client_limits", ClientLimits())
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        #: loop time the head in progress began (the accept, for a connection's first request;
        #: None between requests); a body's last read, while one is still expected
        self._head_since: float | None = None
        self._body_read_at = 0.0
        self._body_pending = False
        self._out: OneWrite | None = None
        self._head_bytes = 0
        self._head_count = 0
        #: the whole answer to send instead of uvicorn's bare 400 when a guard refused the head
        self._refusal: bytes | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if getattr(self.config, "freeze_gc", False):
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
        self._head_since = self.loop.time()
        self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # The guards' timers are armed only when a read leaves a head or a body unfinished: a
        # request that arrives whole in one read (nearly all of them) costs no timer at all.
        if self._head_since is not None and self._head_timer is None:
            due = self._head_since + self.client_limits.header_timeout_s
            self._head_timer = self.loop.call_at(due, self._head_timed_out)
        if self._body_pending and self._body_timer is None:
            due = self._body_read_at + self.client_limits.body_timeout_s
            self._body_timer = self.loop.call_at(due, self._body_stalled)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        # httptools calls this from data_received on the request's first byte: that read is the
        # Timeline's ``received`` (SPEC §6), before parsing, the ASGI task and any queueing
        received = time.perf_counter()
        self._head_bytes = self._head_count = 0
        super().on_message_begin()
        self.scope[RECEIVED_AT] = received  # type: ignore[literal-required]
        if self._head_since is None:  # a kept-alive connection's next request: from its 1st byte
            self._head_since = self.loop.time()

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
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        # a body may follow: the gaps between its reads are watched until message complete
        self._body_read_at = self.loop.time()
        self._body_pending = True

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        # the cycle starts now (at once, or a pipelined one after the previous response): its
        # first write is its response head (or a 100 Continue), held by OneWrite
        out = self._out
        if out is not None:
            out.armed = True
            cycle.transport = out  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        self._body_read_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_pending = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # ------------------------------------------------------------ the guards

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_since is None:  # the head arrived meanwhile
            return
        timeout = self.client_limits.header_timeout_s
        self._close_with_408(
            "client_header_timeout", f"the request head did not arrive within {timeout:g} s"
        )

    def _body_stalled(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if not self._body_pending or cycle is None or self.transport.is_closing():
            return
        timeout = self.client_limits.body_timeout_s
        now = self.loop.time()
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            self._body_read_at = now  # the gateway is not reading: not the client's time
        left = self._body_read_at + timeout - now
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_stalled)
            return
        self._close_with_408(
            "client_body_timeout", f"no request body bytes arrived for {timeout:g} s"
        )

    def _close_with_408(self, code: str, message: str) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_canned(b"408 Request Timeout", code, message))
        if cycle is not None and not cycle.response_complete:
            # the request path sees the client go away; nothing else is written here
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


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


def serve(config: Config) -> int:
    """Run the gateway until SIGTERM (drained: 0) or SIGINT; workers > 1 under the supervisor."""
    server = config.server
    print(
        f"gateway: serving on http://{server.host}:{server.port} (config: {config.source})",
        file=sys.stderr,
        flush=True,
    )
    if server.workers > 1:
        return _serve_workers(config)
    from gateway.app import Gateway

    uv = uvicorn_config(config, Gateway(config))
    uv.freeze_gc = True
    gateway_server = GatewayServer(uv)
    gateway_server.run()
    return 0 if gateway_server.started else STARTUP_FAILURE


def _supervisor(uv: GatewayUvicornConfig, sock: socket.socket) -> Supervisor:
    # uvicorn before 0.5x takes the worker's entry point (``target``); later ones build it
    if "target" in inspect.signature(Multiprocess.__init__).parameters:
        make: Any = Supervisor
        return cast(Supervisor, make(uv, target=uvicorn.Server(config=uv).run, sockets=[sock]))
    return Supervisor(uv, sockets=[sock])


def _serve_workers(config: Config) -> int:
    from gateway.telemetry.metrics import METRICS_DIR_ENV

    # the workers' metrics snapshots, merged by whichever worker answers /metrics
    with tempfile.TemporaryDirectory(prefix="gateway-metrics-") as shared:
        os.environ[METRICS_DIR_ENV] = shared
        uv = uvicorn_config(
            config, "gateway.app:create_app", factory=True, workers=config.server.workers
        )
        uv.freeze_gc = True
        sock = uv.bind_socket()
        supervisor = _supervisor(uv, sock)
        supervisor.run()
    failed = any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    return STARTUP_FAILURE if failed else 0


__all__ = [
    "ClientLimits",
    "GatewayServer",
    "GatewayUvicornConfig",
    "GuardedHttpToolsProtocol",
    "Supervisor",
    "serve",
    "uvicorn_config",
]
