"""Where requests go: ``[[backends]]`` (an upstream, its pool, its timeouts, passive health, its
load) and ``[[routes]]`` (models to backends: retries, strategy, affinity, policies;
docs/spec.md §4, §13, §21)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, urlsplit


def split_url(url: str) -> SplitResult | None:
    """``urlsplit`` that says None instead of raising (a bad IPv6 literal, a bad port)."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return None
    return parts


@dataclass(frozen=True, slots=True)
class BackendConfig:
    name: str
    url: str
    provider: str = "openai"
    api_key_env: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    stream_idle_timeout_s: float = 60.0
    max_connections: int = 200
    #: an idle pooled upstream connection is closed after this (nginx ``keepalive_timeout``)
    idle_timeout_s: float = 30.0
    http2: bool = False
    #: the HTTP/1.1 client: the gateway's own lean one, or aiohttp's (for comparison)
    http1_client: Literal["lean", "aiohttp"] = "lean"
    #: passive health (docs/spec.md §13): consecutive failures that eject the backend (0: never)
    eject_after: int = 5
    #: cool-down before one probe request decides
    eject_for_s: float = 30.0
    #: the field ``max_tokens_cap`` sets when the client sent no limit (None: by host, below)
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] | None = None
    #: the model server's own Prometheus endpoint (vLLM, SGLang; docs/spec.md §21)
    metrics_url: str | None = None
    #: its scrape period; the scrape's timeout is the period too
    metrics_interval_ms: float = 250.0
    #: waiting requests at which the backend counts as saturated
    max_queue: int = 5
    #: KV-cache usage (0..1) at which it counts as saturated
    max_kv_cache: float = 0.8

    @property
    def is_mock(self) -> bool:
        return self.url.startswith("mock:")

    @property
    def tokens_field(self) -> str:
        """``max_tokens_field``, else ``max_completion_tokens`` for OpenAI's and Azure OpenAI's
        hosts (their reasoning models reject ``max_tokens``), else ``max_tokens``
        (docs/spec.md §12)."""
        if self.max_tokens_field is not None:
            return self.max_tokens_field
        host = (split_url(self.url) or urlsplit("")).hostname or ""
        if host == "api.openai.com" or host.endswith((".openai.azure.com", ".openai.azure.us")):
            return "max_completion_tokens"
        return "max_tokens"


@dataclass(frozen=True, slots=True)
class RouteConfig:
    models: tuple[str, ...]
    backends: tuple[str, ...]
    name: str = ""  # defaults to the first model pattern
    retries: int = 2
    retry_on_timeout: bool = False
    max_tokens_cap: int | None = None
    history_window: int | None = None
    #: load balancing over ``backends`` (docs/spec.md §13, §21)
    strategy: Literal["ordered", "weighted", "least_outstanding", "least_loaded"] = "ordered"
    #: with strategy = "weighted", one weight per backend
    weights: tuple[float, ...] | None = None
    #: how long a Responses API id stays routed to the backend that made it (docs/spec.md §22)
    response_affinity_ttl_s: float = 86400.0
    #: keep a session / a prompt prefix on one backend (rendezvous hashing, docs/spec.md §21)
    affinity: Literal["none", "session", "prefix"] = "none"
    #: every backend saturated: 503 backend_saturated instead of the least loaded one
    shed_when_saturated: bool = False
    #: stateful calls that name no model (files, uploads, conversations, vector stores) come
    #: here when their purpose matches one of these globs (docs/spec.md §24)
    purposes: tuple[str, ...] = ()
    #: how long a file, batch, conversation or vector store id stays routed to its backend
    object_ttl_s: float = 30 * 86400.0


__all__ = ["BackendConfig", "RouteConfig", "split_url"]
