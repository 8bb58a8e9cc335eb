"""The sections of the listening side: ``[server]`` (the socket, the client guards, the
browser origins, TLS and HTTP/2) and ``[edge]`` (the proxies trusted and the timing headers of
the hops in front; docs/spec.md §4, §6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``[server.tls]``: the gateway serves TLS on its port (ALPN ``h2``, ``http/1.1``)."""

    #: the certificate chain (PEM, the server's certificate first) and its private key; both
    #: re-read on SIGHUP without dropping a connection
    cert_file: str
    key_file: str
    #: mutual TLS: a client must present a certificate signed by one of these CAs (PEM)
    client_ca_file: str | None = None
    min_version: Literal["1.2", "1.3"] = "1.2"


@dataclass(frozen=True, slots=True)
class Http2Config:
    """``[server.http2]``: HTTP/2 over TLS (by ALPN) and, with ``[server] h2c``, in clear; the
    limits that keep one connection from costing the gateway more than its requests do."""

    #: offer h2 by ALPN (false: TLS clients get HTTP/1.1 only, and h2c is refused)
    enabled: bool = True
    #: SETTINGS_MAX_CONCURRENT_STREAMS; a stream whose request still runs counts, reset or not
    max_concurrent_streams: int = 100
    #: SETTINGS_MAX_HEADER_LIST_SIZE: names + values + 32 octets per field (RFC 9113 §6.5.2)
    max_header_list_bytes: int = 64 * 1024
    #: header fields per request (pseudo-headers included) -> 431
    max_headers: int = 100
    #: CONTINUATION frames after one HEADERS frame
    max_continuation_frames: int = 16
    #: streams one connection may open; then GOAWAY, and the client opens another connection
    max_requests_per_connection: int = 10_000
    #: a connection with no stream open this long is closed with GOAWAY
    idle_timeout_s: float = 60.0
    #: an answer that waits this long at a zero flow-control window is reset (its request: 499)
    stalled_stream_timeout_s: float = 30.0
    #: client resets (RST_STREAM, and streams refused) allowed: a bucket of ``reset_burst``
    #: refilled at ``resets_per_s``; empty -> GOAWAY ENHANCE_YOUR_CALM (CVE-2023-44487)
    resets_per_s: float = 10.0
    reset_burst: int = 100
    #: SETTINGS, PING, PRIORITY, empty DATA, unknown frames and WINDOW_UPDATEs beyond two per
    #: DATA frame sent: a bucket of ``control_frame_burst`` refilled at ``control_frames_per_s``
    control_frames_per_s: float = 100.0
    control_frame_burst: int = 1000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    max_body_bytes: int = 10 * 1024 * 1024
    #: a streamed upload (``POST /v1/files``, upload parts: docs/spec.md §24), never held whole
    max_upload_bytes: int = 512 * 1024 * 1024
    shutdown_grace_s: float = 30.0
    #: a client that has not sent its whole request head by then is closed
    client_header_timeout_s: float = 10.0
    #: max gap between two reads of a request body -> 408, connection closed
    client_body_timeout_s: float = 30.0
    #: beyond it new connections are refused instead of exhausting file descriptors
    max_client_connections: int = 10_000
    #: browser origins whose requests are served (docs/spec.md §25); unset: the gateway's own
    #: origin and loopback origins on any port, which every list allows too; "*": all (unsafe)
    allowed_origins: tuple[str, ...] | None = None
    #: where ``gateway serve`` writes its process id, for ``gateway reload`` (docs/spec.md §29)
    pid_file: str | None = None
    #: cleartext HTTP/2 by prior knowledge (the connection preface) beside HTTP/1.1, for load
    #: balancers that speak h2c to their targets (docs/spec.md §27)
    h2c: bool = False
    tls: TlsConfig | None = None
    http2: Http2Config = field(default_factory=Http2Config)


@dataclass(frozen=True, slots=True)
class EdgeHopConfig:
    name: str
    header: str


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    trusted_proxies: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
    hops: tuple[EdgeHopConfig, ...] = ()


__all__ = ["EdgeConfig", "EdgeHopConfig", "Http2Config", "ServerConfig", "TlsConfig"]
