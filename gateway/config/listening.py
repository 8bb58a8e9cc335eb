"""The sections of the listening side: ``[server]`` (the socket, the client guards, the
browser origins) and ``[edge]`` (the proxies trusted and the timing headers of the hops in
front; docs/spec.md §4, §6)."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True, slots=True)
class EdgeHopConfig:
    name: str
    header: str


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    trusted_proxies: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
    hops: tuple[EdgeHopConfig, ...] = ()


__all__ = ["EdgeConfig", "EdgeHopConfig", "ServerConfig"]
