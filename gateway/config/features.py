"""What the gateway serves besides routing a call: ``[cache]`` (the response cache and its
Redis; docs/spec.md §10), ``[realtime]`` (WebSocket sessions, §19) and ``[[mcp_servers]]``
(§23)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class CacheConfig:
    backend: Literal["memory", "redis", "off"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    #: env var holding the Redis password (kept out of the URL and the file)
    password_env: str | None = None
    cluster: bool = False
    ttl_s: float = 600.0
    mode: Literal["deterministic", "all"] = "deterministic"
    scope: Literal["tenant", "global"] = "tenant"
    max_entry_bytes: int = 1024 * 1024
    namespace: str = "default"
    #: memory backend: LRU bounds
    max_entries: int = 10_000
    max_memory_bytes: int = 256 * 1024 * 1024
    #: redis: socket connect/read timeout per command; a slow Redis costs at most this
    timeout_ms: float = 50.0
    #: circuit breaker: open after this many consecutive failures, probe again after reset_s
    breaker_failures: int = 3
    breaker_reset_s: float = 5.0
    #: single flight across replicas: how long a follower waits for the leader's entry
    flight_wait_ms: float = 5000.0


@dataclass(frozen=True, slots=True)
class RealtimeConfig:
    """``GET /v1/realtime`` WebSocket sessions (docs/spec.md §19)."""

    enabled: bool = True
    #: a bigger message closes the session with 1009
    max_message_bytes: int = 16 * 1024 * 1024
    #: no message either way for this long: close 1000 "idle timeout"
    idle_timeout_s: float = 300.0
    #: close 1000 "session time limit" after this long
    max_session_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One upstream MCP server behind ``/mcp/{name}`` and ``/mcp`` (docs/spec.md §23)."""

    name: str
    #: its Streamable HTTP endpoint (``mock://`` : the built-in one, in process)
    url: str
    #: env var holding a bearer token sent as ``Authorization`` (never the client's)
    api_key_env: str | None = None
    #: more headers from env vars: ``"X-Api-Key=TOOLS_KEY"``
    headers_env: tuple[str, ...] = ()
    #: one JSON-RPC request's whole exchange (its answer or its stream) may last this long
    timeout_s: float = 60.0
    #: tools served (globs over the server's own tool names); deny wins
    tools_allow: tuple[str, ...] = ("*",)
    tools_deny: tuple[str, ...] = ()
    #: a bigger request body or answer message is refused
    max_message_bytes: int = 4 * 1024 * 1024
    #: browser origins allowed besides loopback ones (DNS-rebinding protection)
    allowed_origins: tuple[str, ...] = ()


__all__ = ["CacheConfig", "McpServerConfig", "RealtimeConfig"]
