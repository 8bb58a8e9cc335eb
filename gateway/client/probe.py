"""``gateway probe``: one GET timed the way ``curl -w`` times it (docs/spec.md §3).

The work happens on a socket of our own so that every mark sits where curl puts it:

- everything that is not the request (URL parsing, the SSL context, the request bytes, the HTTP/2
  state machine) is built before the clock starts;
- ``dns``: ``getaddrinfo`` once; the first address it returns is the one connected to;
- ``connect``: the TCP handshake is done (curl's ``time_connect``);
- ``tls``: the TLS handshake is done (``time_appconnect``; https only);
- ``ttfb``: the read that brought the first byte of the response (``time_starttransfer``);
- ``total``: the body has been read to its end (``time_total``).

Every mark is cumulative from the start, like curl's. An HTTP client library would move them:
its construction, its pool and its own DNS lookup fall between them (136 ms of "connect" on
loopback that way, where curl says 0.5 ms).

HTTP/1.1 responses are parsed by httptools (the parser the gateway serves with); when ALPN
selects ``h2`` the exchange is spoken with the ``h2`` state machine (httpx2's ``http2`` extra).

>>> ProbeTarget.parse("http://localhost:8080/healthz").authority
'localhost:8080'
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["MARKS", "ProbeError", "ProbeResult", "ProbeTarget", "make_ssl_context", "probe"]

#: the marks, in the order they happen (curl: namelookup, connect, appconnect, starttransfer, total)
MARKS = ("dns", "connect", "tls", "ttfb", "total")
USER_AGENT = "gateway-probe/1"
_READ = 65536


class ProbeError(Exception):
    """The probe stopped at ``stage`` (one of :data:`MARKS`); ``marks`` holds what it reached."""

    def __init__(self, stage: str, message: str, marks: dict[str, float] | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.marks = dict(marks or {})


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    scheme: str
    host: str
    port: int
    #: path and query, as sent on the request line
    path: str
    #: the Host / :authority value
    authority: str

    @classmethod
    def parse(cls, url: str) -> ProbeTarget:
        """An http(s) URL; ``ValueError`` with a readable message otherwise."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        try:
            explicit = parts.port
        except ValueError:
            raise ValueError(f"bad port in {url}") from None
        default = 443 if parts.scheme == "https" else 80
        port = explicit or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        authority = shown if port == default else f"{shown}:{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, host, port, path, authority)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    url: str
    ip: str
    port: int
    status: int
    #: "HTTP/1.1", "HTTP/1.0" or "HTTP/2"
    http_version: str
    tls_version: str | None
    alpn: str | None
    #: body bytes as they came over the wire (curl's size_download)
    size: int
    headers: list[tuple[str, str]]
    #: mark → seconds since the start (cumulative); "tls" is absent on plain http
    marks: dict[str, float]

    def ms(self, mark: str) -> float | None:
        value = self.marks.get(mark)
        return None if value is None else value * 1000

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ip": self.ip,
            "port": self.port,
            "status": self.status,
            "http_version": self.http_version,
            "tls_version": self.tls_version,
            "alpn": self.alpn,
            "size": self.size,
            "timings_ms": {m: _round(self.ms(m)) for m in MARKS},
        }

    def render(self) -> str:
        """The human form: one summary line, then the five marks like ``curl -w``."""
        head = [self.url, f"status={self.status}", self.http_version]
        if self.tls_version:
            head += [self.tls_version, f"alpn={self.alpn or '-'}"]
        head += [f"{self.size} bytes", f"ip={self.ip}"]
        lines = ["  ".join(head)]
        for m in MARKS:
            value = self.ms(m)
            lines.append(f"  {m:<8}" + (f"{value:9.2f} ms" if value is not None else "        -"))
        return "\n".join(lines)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def make_ssl_context(cacert: str | None = None, alpn: Sequence[str] = ()) -> ssl.SSLContext:
    """Verifying client context (system store, ``SSL_CERT_FILE``, or ``cacert``), like curl's."""
    ctx = ssl.create_default_context(cafile=cacert)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def _h2_available() -> bool:
    try:
        import h2.connection  # noqa: F401
    except ImportError:  # pragma: no cover - h2 comes with httpx2[http2]
        return False
    return True


# ---------------------------------------------------------------- the probe


def probe(
    url: str,
    *,
    headers: Sequence[tuple[str, str]] = (),
    timeout: float = 10.0,
    cacert: str | None = None,
    http2: bool = True,
) -> ProbeResult:
    """GET ``url`` once on a new connection and time it (see the module docstring).

    ``headers`` are added to the request (e.g. Authorization). Raises :class:`ProbeError` (with
    the marks reached) on DNS, connect, TLS, timeout or protocol failure, ``ValueError`` on a URL
    that is not http(s).
    """
    # ---- set-up: all of it before the clock, as curl does
    target = ProbeTarget.parse(url)
    use_h2 = http2 and target.scheme == "https" and _h2_available()
    ctx = (
        make_ssl_context(cacert, ["h2", "http/1.1"] if use_h2 else ["http/1.1"])
        if target.scheme == "https"
        else None
    )
    extra = [(k, v) for k, v in headers if k.lower() not in ("host", "user-agent", "accept")]
    h1_request = _h1_request(target, extra)
    h2_exchange = _H2Exchange(target, extra) if use_h2 else None
    host = _encoded_host(target)
    clock = _ProbeClock(timeout)
    ip, port, sock = _dns_and_connect(host, target, clock)
    try:
        # ---- tls
        conn: socket.socket = sock
        tls_version = alpn = None
        if ctx is not None:
            tls = _tls(sock, ctx, target.host, clock)
            conn = tls
            tls_version, alpn = tls.version(), tls.selected_alpn_protocol()
        # ---- request, first byte, body
        io = _Io(conn, clock.remaining, clock.marks)
        if h2_exchange is not None and alpn == "h2":
            status, version, got, size = h2_exchange.run(io, clock.mark)
        else:
            status, version, got, size = _h1_exchange(io, h1_request, clock.mark)
        clock.mark("total")
    finally:
        sock.close()
    return ProbeResult(
        url=url,
        ip=ip,
        port=port,
        status=status,
        http_version=version,
        tls_version=tls_version,
        alpn=alpn,
        size=size,
        headers=got,
        marks=clock.marks,
    )


def _encoded_host(target: ProbeTarget) -> bytes:
    # getaddrinfo() of a str host first imports the idna codec (~3 ms on a cold process): that
    # is set-up too, so the host is encoded before the clock and the lookup is only the lookup
    try:
        return target.host.encode("idna")
    except UnicodeError:
        raise ValueError(f"not a valid host name: {target.host!r}") from None


class _ProbeClock:
    """The probe's clock: started after all set-up, cumulative marks, one deadline."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.marks: dict[str, float] = {}
        self.start = time.perf_counter()
        self.deadline = self.start + timeout

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter() - self.start

    def remaining(self, stage: str) -> float:
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise ProbeError(stage, f"timed out after {self.timeout:g} s ({stage})", self.marks)
        return left


def _dns_and_connect(
    host: bytes, target: ProbeTarget, clock: _ProbeClock
) -> tuple[str, int, socket.socket]:
    """DNS once, and a TCP connect to the address it gave (the one curl would use)."""
    try:
        infos = socket.getaddrinfo(
            host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError as exc:
        raise ProbeError("dns", f"DNS lookup of {target.host} failed: {_reason(exc)}") from None
    family, kind, proto, _, sockaddr = infos[0]
    ip, port = str(sockaddr[0]), int(sockaddr[1])
    clock.mark("dns")
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(clock.remaining("connect"))
        sock.connect(sockaddr)
    except TimeoutError:
        sock.close()
        raise ProbeError(
            "connect", f"connect to {_addr(ip, port)} timed out", clock.marks
        ) from None
    except OSError as exc:
        sock.close()
        msg = f"connect to {_addr(ip, port)} failed: {_reason(exc)}"
        raise ProbeError("connect", msg, clock.marks) from None
    clock.mark("connect")
    return ip, port, sock


def _tls(sock: socket.socket, ctx: ssl.SSLContext, host: str, clock: _ProbeClock) -> ssl.SSLSocket:
    sock.settimeout(clock.remaining("tls"))
    try:
        tls = ctx.wrap_socket(sock, server_hostname=host)
    except TimeoutError:
        raise ProbeError("tls", "TLS handshake timed out", clock.marks) from None
    except (ssl.SSLError, OSError) as exc:
        msg = f"TLS handshake with {host} failed: {_reason(exc)}"
        raise ProbeError("tls", msg, clock.marks) from None
    clock.mark("tls")
    return tls


def _addr(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(getattr(exc, "verify_message", None) or exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


@dataclass(slots=True)
class _Io:
    """The connected socket, with the probe's deadline applied to every read and write."""

    sock: socket.socket
    remaining: Callable[[str], float]
    marks: dict[str, float]

    def send(self, data: bytes) -> None:
        self.sock.settimeout(self.remaining("ttfb"))
        try:
            self.sock.sendall(data)
        except OSError as exc:
            msg = f"sending the request failed: {_reason(exc)}"
            raise ProbeError("ttfb", msg, self.marks) from None

    def recv(self, stage: str) -> bytes:
        self.sock.settimeout(self.remaining(stage))
        try:
            return self.sock.recv(_READ)
        except TimeoutError:
            msg = f"timed out waiting for the response ({stage})"
            raise ProbeError(stage, msg, self.marks) from None
        except OSError as exc:
            msg = f"reading the response failed: {_reason(exc)}"
            raise ProbeError(stage, msg, self.marks) from None


# ---------------------------------------------------------------- HTTP/1.1


def _h1_request(target: ProbeTarget, extra: Sequence[tuple[str, str]]) -> bytes:
    lines = [
        f"GET {target.path} HTTP/1.1",
        f"Host: {target.authority}",
        f"User-Agent: {USER_AGENT}",
        "Accept: */*",
        *(f"{k}: {v}" for k, v in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(slots=True)
class _H1Response:
    """httptools callbacks."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    headers_done: bool = False
    complete: bool = False
    size: int = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)

    def on_message_complete(self) -> None:
        self.complete = True


def _h1_exchange(
    io: _Io, request: bytes, mark: Callable[[str], None]
) -> tuple[int, str, list[tuple[str, str]], int]:
    response = _H1Response()
    parser = httptools.HttpResponseParser(response)
    io.send(request)
    first = True
    while not response.complete:
        data = io.recv("ttfb" if first else "total")
        if first and data:
            mark("ttfb")
            first = False
        if not data:
            # EOF: the end of a body that had neither Content-Length nor chunked framing
            if response.headers_done and not _framed(response.headers):
                break
            stage = "ttfb" if first else "total"
            raise ProbeError(stage, "the server closed the connection mid-response", io.marks)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - we never ask for an upgrade
            break
        except httptools.HttpParserError as exc:
            raise ProbeError("total", f"malformed HTTP response: {exc}", io.marks) from None
    status = int(parser.get_status_code())
    return status, f"HTTP/{parser.get_http_version()}", response.headers, response.size


def _framed(headers: list[tuple[str, str]]) -> bool:
    names = {k.lower() for k, _ in headers}
    return "content-length" in names or "transfer-encoding" in names


# ---------------------------------------------------------------- HTTP/2


class _H2Exchange:
    """One GET over HTTP/2; the state machine and its first bytes are made before the clock."""

    def __init__(self, target: ProbeTarget, extra: Sequence[tuple[str, str]]) -> None:
        import h2.config
        import h2.connection

        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.stream_id = self.conn.get_next_available_stream_id()
        request = [
            (":method", "GET"),
            (":scheme", target.scheme),
            (":authority", target.authority),
            (":path", target.path),
            ("user-agent", USER_AGENT),
            ("accept", "*/*"),
            *((k.lower(), v) for k, v in extra),
        ]
        self.conn.send_headers(self.stream_id, request, end_stream=True)
        self.preamble = self.conn.data_to_send()

    def run(
        self, io: _Io, mark: Callable[[str], None]
    ) -> tuple[int, str, list[tuple[str, str]], int]:
        import h2.exceptions

        io.send(self.preamble)
        self.status, self.size, self.done = 0, 0, False
        self.headers: list[tuple[str, str]] = []
        while not self.done:
            stage = "ttfb" if not self.status else "total"
            data = io.recv(stage)
            if not data:
                raise ProbeError(stage, "the server closed the connection mid-response", io.marks)
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                raise ProbeError("total", f"HTTP/2 protocol error: {exc}", io.marks) from None
            for ev in events:
                if getattr(ev, "stream_id", self.stream_id) == self.stream_id:
                    self._handle(ev, io, mark)
            pending = self.conn.data_to_send()
            if pending and not self.done:
                io.send(pending)  # window updates, settings acks
        return self.status, "HTTP/2", self.headers, self.size

    def _handle(self, ev: object, io: _Io, mark: Callable[[str], None]) -> None:
        import h2.events

        if isinstance(ev, h2.events.ResponseReceived) and not self.status:
            mark("ttfb")  # the read that carried the response headers
            for k, v in ev.headers or []:
                name, value = _text(k), _text(v)
                if name == ":status":
                    self.status = int(value)
                else:
                    self.headers.append((name, value))
        elif isinstance(ev, h2.events.DataReceived):
            self.size += len(ev.data or b"")
            self.conn.acknowledge_received_data(ev.flow_controlled_length or 0, self.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            self.done = True
        elif isinstance(ev, h2.events.StreamReset | h2.events.ConnectionTerminated):
            raise ProbeError("total", f"HTTP/2 stream ended early: {ev}", io.marks)


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
