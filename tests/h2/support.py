"""TLS and HTTP/2 at the gateway's edge in tests: a test CA made in the test (trustme), the TOML
that serves TLS, and two raw HTTP/2 clients — :class:`H2Client` on ``h2``'s client state machine
(requests, resets, windows: what a client may do) and :class:`FrameClient`, which writes frames
as they are and reads the server's frames one by one (what the attacks send).

Everything connects to 127.0.0.1 only; every socket is closed by the test that opened it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import httpx2
import trustme
from hyperframe.frame import Frame, GoAwayFrame

#: the HTTP/2 client connection preface (RFC 9113 §3.4)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


#: one mock backend serving every model (a TOML body for the configs of these tests)
MOCK = """
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
models = ["*"]
backends = ["mock"]
"""


@dataclass
class Certs:
    """A CA of the test's own and a server certificate it signed for 127.0.0.1 and localhost."""

    ca: trustme.CA
    dir: Path
    cert: Path
    key: Path
    ca_pem: Path

    def client_context(self, alpn: Iterable[str] = ("h2", "http/1.1")) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_pem))
        ctx.set_alpn_protocols(list(alpn))
        return ctx

    def toml(self, extra: str = "") -> str:
        """``[server.tls]`` serving this certificate (``extra``: more keys of that table)."""
        return f'[server.tls]\ncert_file = "{self.cert}"\nkey_file = "{self.key}"\n{extra}\n'

    def client_cert(self, name: str = "client") -> tuple[Path, Path]:
        """A client certificate this CA signed (for mTLS): (chain, key) files."""
        issued = self.ca.issue_cert(f"{name}@example.test")
        chain, key = self.dir / f"{name}.pem", self.dir / f"{name}-key.pem"
        issued.private_key_pem.write_to_path(str(key))
        with chain.open("wb") as out:
            for pem in issued.cert_chain_pems:
                out.write(pem.bytes())
        return chain, key

    def reissue(self, ca: trustme.CA) -> None:
        """Overwrite the server's certificate and key with ones ``ca`` signed."""
        issued = ca.issue_cert("127.0.0.1", "localhost")
        issued.private_key_pem.write_to_path(str(self.key))
        issued.cert_chain_pems[0].write_to_path(str(self.cert))


def make_certs(where: Path) -> Certs:
    where.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    certs = Certs(ca, where, where / "cert.pem", where / "key.pem", where / "ca.pem")
    certs.reissue(ca)
    ca.cert_pem.write_to_path(str(certs.ca_pem))
    return certs


def http2_client(certs: Certs | None = None, **kwargs: Any) -> httpx2.Client:
    """An HTTP/2 httpx2 client as an SDK is given one: over TLS trusting ``certs``' CA, or
    (``certs`` None) cleartext HTTP/2 by prior knowledge."""
    if certs is None:
        return httpx2.Client(http1=False, http2=True, **kwargs)
    return httpx2.Client(http2=True, verify=certs.client_context(), **kwargs)


def connect(port: int, tls: ssl.SSLContext | None = None, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls is None:
        return sock
    return tls.wrap_socket(sock, server_hostname="127.0.0.1")


@dataclass
class Answer:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    ended: bool = False
    #: RST_STREAM's error code from the server (None: not reset)
    reset: int | None = None
    #: the statuses of informational answers (100 Continue)
    informational: list[int] = field(default_factory=list)


class H2Client:
    """A client on ``h2``'s state machine over one socket (TLS with ALPN h2, or h2c)."""

    def __init__(
        self,
        port: int,
        tls: ssl.SSLContext | None = None,
        *,
        settings: dict[int, int] | None = None,
        ack: bool = True,
    ) -> None:
        self.sock = connect(port, tls)
        # what is sent is the test's to choose (a Host that differs from :authority, ...)
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False
        )
        self.conn = h2.connection.H2Connection(config=config)
        if settings:
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.conn.initiate_connection()
        # a connection window as HTTP/2 clients open (httpcore's 16 MiB): a held stream's
        # bytes never shut it for the others
        self.conn.increment_flow_control_window(2**24 - 65_535)
        #: acknowledge DATA as it arrives (False: the client's windows shut once full)
        self.ack = ack
        self.answers: dict[int, Answer] = {}
        #: what the client's h2 refused in the server's frames (it then ends the connection)
        self.errors: list[Exception] = []
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False
        #: what happened, in order: ("ended" | "reset", stream id), ("goaway", last stream id)
        self.order: list[tuple[str, int]] = []
        #: streams whose DATA is not acknowledged (their window shuts) until :meth:`release`
        self.hold: set[int] = set()
        self._held: dict[int, int] = {}
        #: bytes read and not yet given to ``h2`` (:meth:`read_until_goaway`)
        self._pending = b""
        #: bytes of a frame not yet whole (h2 is given whole frames only: :meth:`_feed`)
        self._rx = b""
        self.flush()

    def release(self, sid: int) -> None:
        """Acknowledge what a held stream received: its window opens again."""
        self.hold.discard(sid)
        held = self._held.pop(sid, 0)
        if held:
            self.conn.acknowledge_received_data(held, sid)
            self.flush()

    def read_until_goaway(self, timeout: float = 10.0) -> None:
        """Read until the server's GOAWAY is in, without letting ``h2`` see it yet: the client
        may still open a stream, as one whose GOAWAY is on its way does."""
        deadline = time.monotonic() + timeout
        while not _has_goaway(self._pending):
            assert time.monotonic() < deadline, "no GOAWAY"
            self.sock.settimeout(1.0)
            with contextlib.suppress(TimeoutError, socket.timeout):
                data = self.sock.recv(65536)
                assert data, "closed before a GOAWAY"
                self._pending += data

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.closed:
            self.sock.sendall(data)

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        *,
        end: bool = True,
        authority: str = "127.0.0.1",
    ) -> int:
        sid = self.conn.get_next_available_stream_id()
        head = [(":method", method), (":scheme", "https"), (":path", path)]
        head += [(":authority", authority), *headers]
        if body:
            head.append(("content-length", str(len(body))))
        encoded = [(k.encode(), v.encode()) for k, v in head]
        self.conn.send_headers(sid, encoded, end_stream=end and not body)
        if body:
            self.conn.send_data(sid, body, end_stream=end)
        self.answers[sid] = Answer()
        self.flush()
        return sid

    def pump(self, timeout: float = 10.0) -> bool:
        """One read (at most ``timeout``): False when the connection is closed."""
        if self.closed:
            return False
        if self._pending:  # bytes held back by read_until_goaway: h2 sees them now
            data, self._pending = self._pending, b""
            self._feed(data)
            return True
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except OSError:
            data = b""
        if not data:  # the server closed: so does the client (as HTTP/2 clients do)
            self.closed = True
            self.close()
            return False
        self._feed(data)
        return True

    def _feed(self, data: bytes) -> None:
        """Give ``h2`` the whole frames read so far, one frame at a time: a GOAWAY closes its
        state machine, which :meth:`_event` opens again before the next frame (in one call,
        a frame after the GOAWAY would be refused and the whole call's events lost)."""
        buf = self._rx = self._rx + data
        at = 0
        while len(buf) - at >= 9:
            end = at + 9 + int.from_bytes(buf[at : at + 3], "big")
            if end > len(buf):
                break
            try:
                events = self.conn.receive_data(buf[at:end])
            except h2.exceptions.ProtocolError as exc:  # kept: a test's failure shows it
                self.errors.append(exc)
                events = []
            for event in events:
                self._event(event)
            at = end
        self._rx = buf[at:]
        with contextlib.suppress(h2.exceptions.ProtocolError, OSError):
            self.flush()

    def _event(self, event: Any) -> None:
        sid = getattr(event, "stream_id", 0)
        answer = self.answers.get(sid)
        if isinstance(event, h2.events.ResponseReceived) and answer is not None:
            answer.headers = dict(event.headers)
            answer.status = int(answer.headers[b":status"])
        elif isinstance(event, h2.events.InformationalResponseReceived) and answer is not None:
            answer.informational.append(int(dict(event.headers)[b":status"]))
        elif isinstance(event, h2.events.DataReceived) and answer is not None:
            answer.body += event.data
            flow = event.flow_controlled_length
            if sid in self.hold:
                self._held[sid] = self._held.get(sid, 0) + flow
            elif self.ack and flow:
                self.conn.acknowledge_received_data(flow, sid)
        elif isinstance(event, h2.events.StreamEnded) and answer is not None:
            answer.ended = True
            self.order.append(("ended", sid))
        elif isinstance(event, h2.events.StreamReset) and answer is not None:
            answer.reset = int(event.error_code)
            self.order.append(("reset", sid))
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event
            self.order.append(("goaway", event.last_stream_id or 0))
            # h2 takes any GOAWAY as the end of every stream; RFC 9113 §6.8 lets the streams
            # up to its last stream id finish: the client keeps reading them
            self.conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN

    def until(self, done: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Read until ``done()`` (True) or the connection closes / ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(min(left, 1.0)):
                return done()
        return True

    def answer(self, sid: int, timeout: float = 10.0) -> Answer:
        """The stream's answer once it ended or was reset."""
        answer = self.answers[sid]
        self.until(lambda: answer.ended or answer.reset is not None, timeout)
        return answer

    def until_closed(self, timeout: float = 10.0) -> bool:
        return self.until(lambda: self.closed, timeout)


class FrameClient:
    """Frames written as they are and the server's read one by one (the attacks)."""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.sock = connect(port, tls)
        self.buffer = b""
        self.frames: list[Frame] = []
        self.closed = False

    def __enter__(self) -> FrameClient:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, *frames: Frame | bytes) -> bool:
        """Write (False once the server closed or reset the connection)."""
        data = b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames)
        self.sock.settimeout(10.0)  # a poll() left the socket non-blocking: a full send buffer
        try:  # would raise BlockingIOError, which is no close
            self.sock.sendall(data)
        except OSError:
            self.closed = True
            return False
        return True

    def read(self, timeout: float | None = 10.0) -> bool:
        """One read (``timeout`` None: only what has arrived): False when the connection is
        closed."""
        if self.closed:
            return False
        self.sock.settimeout(timeout if timeout is not None else 0.0)
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            return True
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.buffer += data
        while len(self.buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
            if len(self.buffer) < 9 + length:
                break
            frame.parse_body(memoryview(self.buffer[9 : 9 + length]))
            self.buffer = self.buffer[9 + length :]
            self.frames.append(frame)
        return True

    def poll(self) -> None:
        """Read what has arrived, without waiting."""
        before = -1
        while not self.closed and len(self.buffer) + len(self.frames) != before:
            before = len(self.buffer) + len(self.frames)
            self.read(None)

    def goaway(self) -> GoAwayFrame | None:
        return next((f for f in self.frames if isinstance(f, GoAwayFrame)), None)

    def until_closed(self, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.read(min(1.0, deadline - time.monotonic())):
                return True
        return False

    def count(self, kind: type[Frame]) -> int:
        return sum(isinstance(f, kind) for f in self.frames)


def handshake(client: FrameClient, settings: dict[int, int] | None = None) -> None:
    """The preface and the client's SETTINGS, as every connection starts."""
    from hyperframe.frame import SettingsFrame

    client.send(PREFACE, SettingsFrame(0, settings=settings or {}))


def _has_goaway(data: bytes) -> bool:
    """Whether whole frames in ``data`` include a GOAWAY."""
    at = 0
    while len(data) - at >= 9:
        length = int.from_bytes(data[at : at + 3], "big")
        if data[at + 3] == 0x7:
            return True
        at += 9 + length
    return False
