"""The ``idle`` row: how the server ends a connection its client left idle — with GOAWAY, or
silently (docs/spec.md §17, §27).

A client that reuses a pooled connection the server has just closed loses the request it
sent on it (for a model call, a POST: not retried by every client). HTTP/2 exists to avoid
that: a server says GOAWAY before it closes, and the client opens a new connection for its
next request. One connection is opened as the server is best spoken to — HTTP/2 by ALPN over
TLS, HTTP/2 by prior knowledge (h2c) in clear when the server takes it, else HTTP/1.1 — one
``GET /models`` is answered on it, and then it is left idle for ``--idle-wait`` seconds (it is
longer than the server's idle timeout, the gateway's ``[server.http2] idle_timeout_s``):

- GOAWAY, then the close: ``ok`` (the value: the GOAWAY's code and when it came);
- a close with no GOAWAY on HTTP/2: ``fail``;
- HTTP/1.1 has no GOAWAY: ``skip``, with when the connection closed;
- still open after the wait, or no wait asked for (``--idle-wait 0``, the default): ``skip``.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Final

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import httptools

from gateway.client.doctor.report import Check
from gateway.client.doctor.timed_client import USER_AGENT
from gateway.client.probe import ProbeTarget, make_ssl_context

__all__ = ["IDLE", "check_idle"]

#: the idle row's threshold: an idle connection ends with GOAWAY
IDLE: Final = "GOAWAY"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None)


def check_idle(
    base: str, wait: float, *, api_key: str | None, cacert: str | None, timeout: float
) -> Check:
    """The ``idle`` row for ``base`` (see the module)."""
    if wait <= 0:
        return Check(
            "idle",
            None,
            None,
            IDLE,
            "skip",
            "pass --idle-wait S (longer than the server's idle timeout; the gateway's is "
            "[server.http2] idle_timeout_s, 60 s by default) to see how an idle connection ends",
        )
    target = ProbeTarget.parse(base.rstrip("/") + "/models")
    auth = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else []
    try:
        return _check(target, wait, auth, cacert, timeout)
    except (OSError, h2.exceptions.H2Error, httptools.HttpParserError) as exc:
        return Check("idle", None, None, IDLE, "fail", f"the connection failed: {exc}")


def _check(
    target: ProbeTarget,
    wait: float,
    auth: list[tuple[bytes, bytes]],
    cacert: str | None,
    timeout: float,
) -> Check:
    sock = socket.create_connection((target.host, target.port), timeout=timeout)
    try:
        if target.scheme == "https":
            ctx = make_ssl_context(cacert, ("h2", "http/1.1"))
            sock = ctx.wrap_socket(sock, server_hostname=target.host)
            assert isinstance(sock, ssl.SSLSocket)
            if sock.selected_alpn_protocol() == "h2":
                return _h2(sock, target, wait, auth, "h2 (ALPN)")
        elif _speaks_h2c(sock, timeout):
            return _h2(sock, target, wait, auth, "h2c (prior knowledge)", preface_sent=True)
        else:  # the server refused the preface: a new connection, on HTTP/1.1
            sock.close()
            sock = socket.create_connection((target.host, target.port), timeout=timeout)
        return _h1(sock, target, wait, auth)
    finally:
        sock.close()


def _speaks_h2c(sock: socket.socket, timeout: float) -> bool:
    """Send the HTTP/2 preface in clear: a server that takes it answers with SETTINGS."""
    config = h2.connection.H2Connection(config=_H2_CONFIG)
    config.initiate_connection()
    sock.sendall(config.data_to_send())
    sock.settimeout(min(timeout, 5.0))
    try:
        first = sock.recv(9, socket.MSG_PEEK)
    except TimeoutError:
        return False
    return len(first) >= 4 and first[3] == 0x4  # a SETTINGS frame, not "HTTP/1.1 400"


def _h2(
    sock: socket.socket,
    target: ProbeTarget,
    wait: float,
    auth: list[tuple[bytes, bytes]],
    how: str,
    *,
    preface_sent: bool = False,
) -> Check:
    conn = h2.connection.H2Connection(config=_H2_CONFIG)
    conn.initiate_connection()
    out = conn.data_to_send()
    if not preface_sent:
        sock.sendall(out)
    head = [(b":method", b"GET"), (b":scheme", target.scheme.encode())]
    head += [(b":path", target.path.encode()), (b":authority", target.authority.encode())]
    conn.send_headers(1, [*head, (b"user-agent", USER_AGENT.encode()), *auth], end_stream=True)
    sock.sendall(conn.data_to_send())
    answered = goaway = None
    status = 0
    while True:
        now = time.monotonic()
        if answered is not None and now - answered >= wait:
            return _open(how, wait, status)
        sock.settimeout(wait if answered is None else wait - (now - answered))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            if answered is None:
                raise
            continue
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                answered = time.monotonic()
            elif isinstance(event, h2.events.ConnectionTerminated) and goaway is None:
                goaway = (event, time.monotonic())
        sock.sendall(conn.data_to_send())
    return _closed(how, status, answered, goaway)


def _open(how: str, wait: float, status: int) -> Check:
    detail = f"{how}; GET /models: HTTP {status}"
    return Check(
        "idle",
        f"open after {wait:g} s",
        None,
        IDLE,
        "skip",
        "still open: wait longer than the server's idle timeout (--idle-wait)",
        detail,
    )


def _closed(
    how: str,
    status: int,
    answered: float | None,
    goaway: tuple[h2.events.ConnectionTerminated, float] | None,
) -> Check:
    detail = f"{how}; GET /models: HTTP {status}"
    since = answered if answered is not None else time.monotonic()
    if goaway is not None:
        event, at = goaway
        code = getattr(event.error_code, "name", str(event.error_code))
        debug = (
            f" ({event.additional_data.decode(errors='replace')})" if event.additional_data else ""
        )
        value = f"GOAWAY {code}{debug} after {at - since:.1f} s"
        return Check("idle", value, None, IDLE, "ok", "", detail)
    value = f"closed silently after {time.monotonic() - since:.1f} s"
    hint = (
        "the server closed an idle HTTP/2 connection without GOAWAY: a client that reuses it "
        "meanwhile loses its request; the server should send GOAWAY before it closes"
    )
    return Check("idle", value, None, IDLE, "fail", hint, detail)


def _h1(
    sock: socket.socket, target: ProbeTarget, wait: float, auth: list[tuple[bytes, bytes]]
) -> Check:
    lines = [
        f"GET {target.path} HTTP/1.1",
        f"Host: {target.authority}",
        f"User-Agent: {USER_AGENT}",
    ]
    request = "\r\n".join(lines).encode() + b"".join(b"\r\n" + k + b": " + v for k, v in auth)
    sock.sendall(request + b"\r\n\r\n")
    done: list[bool] = []

    class _Parsed:
        def on_message_complete(self) -> None:
            done.append(True)

    parser = httptools.HttpResponseParser(_Parsed())
    while not done:
        data = sock.recv(65536)
        if not data:
            raise OSError("the server closed the connection mid-response")
        parser.feed_data(data)
    answered = time.monotonic()
    status = parser.get_status_code()
    sock.settimeout(wait)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return _open("HTTP/1.1", wait, status)
    value = f"HTTP/1.1, closed after {time.monotonic() - answered:.1f} s"
    hint = "HTTP/1.1 has no GOAWAY: serve HTTP/2 (TLS, or h2c) for clients to see the close"
    return Check("idle", value, None, IDLE, "skip", hint, f"http/1.1; GET /models: HTTP {status}")
