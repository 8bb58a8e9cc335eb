"""Typed settings: TOML file + ``GATEWAY__SECTION__KEY`` environment overrides (docs/spec.md §3,
§4).

Every section is a frozen dataclass; :func:`load_config` builds them from plain data and
collects *every* problem as ``path.to.key: message`` (unknown keys included), so
``gateway check-config`` can print them all at once.

>>> cfg = load_config(env={"GATEWAY__SERVER__PORT": "9000"})  # the embedded default + env
>>> cfg.server.port, cfg.backends[0].url
(9000, 'mock://')
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

from gateway.origins import check_entries
from gateway.target import is_canonical

ENV_PREFIX = "GATEWAY__"
CONFIG_ENV = "GATEWAY_CONFIG"


class ConfigError(Exception):
    """Raised with every problem found; ``errors`` holds ``path: message`` strings."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ---------------------------------------------------------------- sections


# ---- [server.tls], [server.http2] and [server] h2c: TLS and HTTP/2 at the edge (docs/spec.md §27)


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
    #: cleartext HTTP/2 by prior knowledge (the connection preface) beside HTTP/1.1, for load
    #: balancers that speak h2c to their targets (docs/spec.md §27)
    h2c: bool = False
    tls: TlsConfig | None = None
    http2: Http2Config = field(default_factory=Http2Config)


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
        host = (_url(self.url) or urlsplit("")).hostname or ""
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


@dataclass(frozen=True, slots=True)
class EdgeHopConfig:
    name: str
    header: str


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    trusted_proxies: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
    hops: tuple[EdgeHopConfig, ...] = ()


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
class TracingConfig:
    exporter: Literal["otlp", "console", "none"] = "none"
    #: OTLP endpoint; unset = OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT or the SDK default
    endpoint: str | None = None
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    sample_ratio: float = 1.0
    service_name: str = "llm-gateway"
    trust_incoming: bool = True
    #: put prompts and completions on spans (off: they never leave the process)
    capture_content: bool = False
    #: export queue bounds: a dead collector costs dropped spans, never request time. Bigger
    #: batches than the SDK's 512: each export call costs ~0.7 ms of CPU however small it is
    max_queue_size: int = 8192
    max_export_batch_size: int = 2048
    schedule_delay_ms: float = 1000.0
    export_timeout_s: float = 5.0
    #: on shutdown, wait at most this long for the exporter to flush
    shutdown_timeout_s: float = 3.0
    #: the keys of this section the file or a ``GATEWAY__TRACING__*`` variable wrote (filled
    #: by :func:`build_config`): those win over ``OTEL_*`` variables (docs/spec.md §7)
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def is_explicit(self, name: str) -> bool:
        """Whether key ``name`` was written (or, for a section built in code, differs from its
        default): then it wins over the matching ``OTEL_*`` variable."""
        if name in self.explicit:
            return True
        default = next(f.default for f in dataclasses.fields(self) if f.name == name)
        return bool(getattr(self, name) != default)


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    access_log: Literal["all", "sampled", "off"] = "sampled"
    slow_ms: float = 500.0
    sample_ratio: float = 0.01
    level: Literal["debug", "info", "warning", "error"] = "info"
    #: "json": every line the process writes is one JSON object; "text": for humans
    format: Literal["json", "text"] = "json"


@dataclass(frozen=True, slots=True)
class AuthKeyConfig:
    tenant: str
    #: sha256 hex digest of the key (``gateway hash-key KEY``); the key itself is never stored
    sha256: str
    #: allowed model globs
    models: tuple[str, ...] = ("*",)
    #: requests per minute (None: unlimited)
    rpm: int | None = None
    #: tokens per minute, input + output, debited from the usage the upstream reports
    tpm: int | None = None
    #: may open the live view (``/_gateway/``) when auth is on
    admin: bool = False
    #: spend limit in USD per ``budget_period`` (docs/spec.md §20; None: no budget)
    budget_usd: float | None = None
    budget_period: Literal["day", "week", "month", "total"] = "month"
    #: the ``[[mcp_servers]]`` this key may use (globs over their names; docs/spec.md §23):
    #: none unless listed
    mcp_servers: tuple[str, ...] = ()
    #: the tools it may call there, as globs over ``{server}__{tool}``
    mcp_tools: tuple[str, ...] = ("*",)
    #: the paths the gateway does not model that this key may reach, globs over the whole
    #: path (docs/spec.md §26); None: none, or every path for an admin key
    passthrough: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A budget shared by every key of one tenant (docs/spec.md §20)."""

    name: str
    budget_usd: float | None = None
    budget_period: Literal["day", "week", "month", "total"] = "month"
    #: narrow what its keys may use on MCP servers (docs/spec.md §23; None: as the key says)
    mcp_servers: tuple[str, ...] | None = None
    mcp_tools: tuple[str, ...] | None = None
    #: narrow the paths its keys may reach unmodelled (docs/spec.md §26; None: as the key says)
    passthrough: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class AuthConfig:
    mode: Literal["off", "keys"] = "off"
    #: limits shared by replicas; None: the [cache] url when cache.backend = "redis", else
    #: in-process counting
    redis_url: str | None = None
    #: per Redis command of the limiter; a dead Redis costs at most this (then a breaker)
    timeout_ms: float = 50.0
    keys: tuple[AuthKeyConfig, ...] = ()
    tenants: tuple[TenantConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class PriceConfig:
    """USD per 1M tokens for the models matching ``models`` (docs/spec.md §20)."""

    models: tuple[str, ...]
    input: float
    output: float
    #: prompt tokens served from the provider's prompt cache [input]
    cached_input: float | None = None
    #: Anthropic ``cache_creation_input_tokens`` [input]
    cache_write: float | None = None
    #: a batch's usage is priced at the list price times this (OpenAI and Anthropic bill
    #: batches at half price; docs/spec.md §24)
    batch_discount: float = 0.5


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


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    #: GET /metrics (false: no endpoint and no per-request cost)
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class UiConfig:
    #: the built-in live view (docs/spec.md §18). Unset: on when the gateway listens on loopback
    #: only or auth is on, off otherwise (resolved by :func:`build_config`)
    enabled: bool | None = None
    path: str = "/_gateway/"
    #: requests kept in its ring buffer
    recent: int = 500


@dataclass(frozen=True, slots=True)
class Config:
    # empty defaults so a file missing them still gets every other key checked
    backends: tuple[BackendConfig, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    server: ServerConfig = field(default_factory=ServerConfig)
    edge: EdgeConfig = field(default_factory=EdgeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    prices: tuple[PriceConfig, ...] = ()
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    mcp_servers: tuple[McpServerConfig, ...] = ()
    #: where the config came from (a path, or "<embedded default>")
    source: str = field(default="<text>", compare=False)
    #: the key paths the file or a ``GATEWAY__*`` variable set (``"tracing.protocol"``,
    #: ``"backends[0].url"``): an explicit key wins over an ``OTEL_*`` variable (docs/spec.md §7)
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def is_set(self, path: str) -> bool:
        """Whether ``path`` (``"tracing.endpoint"``) was written, not left at its default."""
        return path in self.explicit

    def backend(self, name: str) -> BackendConfig:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)


# ---------------------------------------------------------------- loading


def default_config_text() -> str:
    """The embedded default (shipped inside the package; ``config/gateway.toml`` is its copy)."""
    return resources.files("gateway").joinpath("default.toml").read_text("utf-8")


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load ``path``, else ``text``, else ``$GATEWAY_CONFIG``, else the embedded default.

    ``GATEWAY__SECTION__KEY`` environment variables override file values.
    """
    env = os.environ if env is None else env
    if text is None:
        if path is None and env.get(CONFIG_ENV):
            path = env[CONFIG_ENV]
        if path is None:
            text, source = default_config_text(), "<embedded default>"
        else:
            source = str(path)
            try:
                text = Path(path).read_text("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else None
                raise ConfigError([f"{source}: cannot read: {reason or exc}"]) from exc
    else:
        source = "<text>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: invalid TOML: {exc}"]) from exc
    return build_config(data, env, source)


def build_config(
    data: dict[str, Any], env: Mapping[str, str] | None = None, source: str = "<data>"
) -> Config:
    """A :class:`Config` from parsed TOML data (plus ``GATEWAY__*`` overrides from ``env``).

    Raises :class:`ConfigError` listing every problem; never anything else, whatever ``data``
    holds (a hypothesis test feeds it random shapes).
    """
    errors: list[str] = []
    _apply_env(data, os.environ if env is None else env, errors)
    cfg = _build(Config, data, "", errors)
    if isinstance(cfg, Config):  # keys that failed to build took stand-ins: check the rest
        _validate(cfg, errors)
    if errors:
        raise ConfigError(errors)
    assert isinstance(cfg, Config)
    routes = tuple(dataclasses.replace(r, name=r.name or r.models[0]) for r in cfg.routes)
    ui = cfg.ui
    if ui.enabled is None:  # docs/spec.md §18: on where only this host or a key holder reaches it
        ui = dataclasses.replace(
            ui, enabled=is_loopback(cfg.server.host) or cfg.auth.mode == "keys"
        )
    explicit = frozenset(_paths(data, ""))
    written = frozenset(p.split(".", 1)[1] for p in explicit if p.startswith("tracing."))
    tracing = dataclasses.replace(cfg.tracing, explicit=written)
    return dataclasses.replace(
        cfg, routes=routes, ui=ui, tracing=tracing, source=source, explicit=explicit
    )


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine (``127.0.0.1``, ``::1``,
    ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _paths(node: Any, prefix: str) -> list[str]:
    """Every key path present in parsed data: tables and their keys, array items by index."""
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = _key(prefix, key)
            out.append(path)
            out.extend(_paths(value, path))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict):
                out.extend(_paths(value, _key(prefix, i)))
    return out


class _EnvValue(str):
    """A raw string from the environment; converted by the target field's type."""


def _apply_env(data: dict[str, Any], env: Mapping[str, str], errors: list[str]) -> None:
    # GATEWAY__SERVER__PORT=9000, GATEWAY__BACKENDS__0__URL=..., GATEWAY__ROUTES__0__MODELS='["a*"]'
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            errors.append(f"{name}: empty path segment in environment override")
            continue
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) > len(node):
                    errors.append(f"{_join(parts[: i + 1])}: no such list index (from {name})")
                    break
                idx = int(part)
                if idx == len(node):  # one past the end appends a new table
                    node.append({})
                if last:
                    node[idx] = _EnvValue(env[name])
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[part] = _EnvValue(env[name])
                else:
                    node = node.setdefault(part, {} if not parts[i + 1].isdigit() else [])
            else:
                errors.append(f"{_join(parts[:i])}: is not a table (from {name})")
                break


def _join(parts: list[str]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def _key(prefix: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{prefix}[{name}]"
    return f"{prefix}.{name}" if prefix else name


_MISSING = object()


def _build(tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    """Convert plain TOML data to ``tp``; append ``path: message`` to ``errors`` on problems.

    Returns :data:`_MISSING` for a value that could not be converted (already reported).
    """
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build_table(tp, value, path, errors)
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(args[0], value, path, errors)
    if origin is tuple:
        return _build_array(typing.get_args(tp)[0], value, path, errors)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not isinstance(value, str) or value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            errors.append(f"{path}: must be one of {choices}, got {_show(value)}")
            return _MISSING
        return str(value)
    if tp is bool:
        return _build_bool(value, path, errors)
    if tp is int or tp is float:
        return _build_number(tp, value, path, errors)
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {_tname(value)}")
            return _MISSING
        return str(value)
    raise TypeError(f"config type not handled: {tp!r}")  # pragma: no cover - programming error


def _build_table(tp: type[Any], value: Any, path: str, errors: list[str]) -> Any:
    if not isinstance(value, dict):
        errors.append(f"{path or '<root>'}: expected a table, got {_tname(value)}")
        return _MISSING
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.name not in ("source", "explicit")}
    for key in value:
        if key not in fields:
            errors.append(f"{_key(path, key)}: unknown key")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        built = _MISSING
        if name in value:
            built = _build(hints[name], value[name], _key(path, name), errors)
        elif required:
            errors.append(f"{_key(path, name)}: required key is missing")
        if built is not _MISSING:
            kwargs[name] = built
        elif required:
            # reported above: a well-typed stand-in keeps the other keys checkable
            kwargs[name] = _placeholder(hints[name])
    return tp(**kwargs)


def _placeholder(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return ()
    if origin is Literal:
        return typing.get_args(tp)[0]
    if origin in (types.UnionType, typing.Union):
        return None
    return {str: "", int: 0, float: 0.0, bool: False}[tp]


def _build_array(item_tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, _EnvValue):
        value = _parse_env_list(value)
    if not isinstance(value, list):
        errors.append(f"{path}: expected an array, got {_tname(value)}")
        return _MISSING
    items = [_build(item_tp, v, _key(path, i), errors) for i, v in enumerate(value)]
    if all(item is not _MISSING for item in items):
        return tuple(items)
    if dataclasses.is_dataclass(item_tp):
        # tables keep their index (later errors name the right one): a stand-in for the bad one
        return tuple(_stand_in(item_tp) if item is _MISSING else item for item in items)
    return _MISSING  # reported; the array takes its default (or a stand-in)


def _stand_in(tp: Any) -> Any:
    """A table of type ``tp`` with placeholder values for its required keys."""
    hints = typing.get_type_hints(tp)
    required = {
        f.name: _placeholder(hints[f.name])
        for f in dataclasses.fields(tp)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return tp(**required)


def _build_bool(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, _EnvValue):
        low = value.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
    if not isinstance(value, bool):
        errors.append(f"{path}: expected true or false, got {_show(value)}")
        return _MISSING
    return value


def _build_number(tp: type[int] | type[float], value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, _EnvValue):
        try:
            value = tp(value)
        except ValueError:
            errors.append(f"{path}: expected a number, got {str(value)!r}")
            return _MISSING
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int and isinstance(value, float):
        ok = False
    if ok and tp is float and value != value:  # nan
        ok = False
    if not ok:
        what = "an integer" if tp is int else "a number"
        errors.append(f"{path}: expected {what}, got {_show(value)}")
        return _MISSING
    return tp(value)


def _parse_env_list(raw: str) -> Any:
    try:
        parsed = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return [_EnvValue(p.strip()) for p in raw.split(",") if p.strip()]
    return parsed


def _tname(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _show(value: Any) -> str:
    """A value for an error message: short, and never a whole table."""
    if isinstance(value, dict | list):
        return _tname(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- cross-field checks


class _Errors:
    """Collects ``path: message``; a path already reported (say, of the wrong type) is not
    reported again for a follow-on problem of its stand-in value."""

    def __init__(self, errors: list[str]) -> None:
        self._errors = errors
        self._seen = {e.split(": ", 1)[0] for e in errors}

    def __call__(self, path: str, message: str) -> None:
        if not any(_related(path, seen) for seen in self._seen):
            self._errors.append(f"{path}: {message}")
            self._seen.add(path)

    def positive(self, section: object, prefix: str, *names: str, allow_zero: bool = False) -> None:
        for name in names:
            value = getattr(section, name)
            if value < 0 or (value == 0 and not allow_zero):
                self(f"{prefix}.{name}", "must be >= 0" if allow_zero else "must be > 0")


def _related(a: str, b: str) -> bool:
    """Whether one key path is the other or inside it (``routes[0]`` and ``routes[0].models``)."""
    if len(a) > len(b):
        a, b = b, a
    return b == a or (b.startswith(a) and b[len(a)] in ".[")


def _validate(cfg: Config, errors: list[str]) -> None:
    err = _Errors(errors)
    _check_server(cfg.server, err)
    names = _check_backends(cfg.backends, err)
    _check_routes(cfg.routes, names, err)
    _check_tokens_fields(cfg, err)
    _check_edge(cfg.edge, err)
    _check_cache(cfg.cache, err)
    _check_tracing(cfg.tracing, err)
    if not 0.0 <= cfg.logging.sample_ratio <= 1.0:
        err("logging.sample_ratio", f"must be within 0..1, got {cfg.logging.sample_ratio}")
    _check_auth(cfg.auth, err)
    _check_ui(cfg.ui, err)
    _check_prices(cfg.prices, err)
    err.positive(cfg.realtime, "realtime", "max_message_bytes", "idle_timeout_s", "max_session_s")
    _check_mcp_servers(cfg.mcp_servers, err)


def _url(url: str) -> SplitResult | None:
    """``urlsplit`` that says None instead of raising (a bad IPv6 literal, a bad port)."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return None
    return parts


def _check_server(s: ServerConfig, err: _Errors) -> None:
    if not 0 < s.port < 65536:
        err("server.port", f"must be 1..65535, got {s.port}")
    if s.workers < 1:
        err("server.workers", f"must be >= 1, got {s.workers}")
    err.positive(s, "server", "max_body_bytes", "client_header_timeout_s", "client_body_timeout_s")
    err.positive(s, "server", "max_upload_bytes")
    err.positive(s, "server", "max_client_connections")
    err.positive(s, "server", "shutdown_grace_s", allow_zero=True)
    for problem in check_entries(s.allowed_origins or ()):
        err("server.allowed_origins", problem)
    _check_tls_http2(s, err)


def _check_tls_http2(s: ServerConfig, err: _Errors) -> None:
    """``[server.tls]``, ``[server.http2]``, ``[server] h2c`` (docs/spec.md §27). The files are
    read when the server starts: a path that cannot be read is its one-line startup error."""
    if s.tls is not None:
        for name in ("cert_file", "key_file"):
            if not getattr(s.tls, name).strip():
                err(f"server.tls.{name}", "must name a PEM file")
        if s.tls.client_ca_file is not None and not s.tls.client_ca_file.strip():
            err("server.tls.client_ca_file", "must name a PEM file (or be left out)")
    h = s.http2
    err.positive(h, "server.http2", "max_concurrent_streams", "max_header_list_bytes")
    err.positive(h, "server.http2", "max_headers", "max_requests_per_connection")
    err.positive(h, "server.http2", "idle_timeout_s", "stalled_stream_timeout_s")
    err.positive(h, "server.http2", "resets_per_s", "reset_burst")
    err.positive(h, "server.http2", "control_frames_per_s", "control_frame_burst")
    err.positive(h, "server.http2", "max_continuation_frames", allow_zero=True)
    if h.max_concurrent_streams > 2**31 - 1:
        err("server.http2.max_concurrent_streams", "must be < 2**31")
    if s.h2c and not h.enabled:
        err("server.h2c", "needs [server.http2] enabled = true")


def _check_backends(backends: tuple[BackendConfig, ...], err: _Errors) -> set[str]:
    if not backends:
        err("backends", "at least one [[backends]] table is required")
    seen: set[str] = set()
    for i, b in enumerate(backends):
        p = f"backends[{i}]"
        if not b.name:
            err(f"{p}.name", "must not be empty")
        elif b.name in seen:
            err(f"{p}.name", f"duplicate backend name {b.name!r}")
        seen.add(b.name)
        parts = _url(b.url)
        if parts is None:
            err(f"{p}.url", f"not a valid URL: {b.url!r}")
        elif parts.scheme not in ("http", "https", "mock"):
            err(f"{p}.url", f"scheme must be http, https or mock, got {b.url!r}")
        elif parts.scheme != "mock" and not parts.hostname:
            err(f"{p}.url", f"has no host: {b.url!r}")
        elif parts.fragment or (parts.query and parts.scheme != "mock"):
            err(f"{p}.url", f"must not carry a query or fragment: {b.url!r}")
        err.positive(b, p, "connect_timeout_s", "read_timeout_s", "stream_idle_timeout_s")
        err.positive(b, p, "max_connections", "eject_for_s", "idle_timeout_s")
        err.positive(b, p, "eject_after", allow_zero=True)
        if b.api_key_env is not None and not b.api_key_env:
            err(f"{p}.api_key_env", "must name an environment variable")
        _check_backend_load(b, p, err)
    return seen


def _check_backend_load(b: BackendConfig, p: str, err: _Errors) -> None:
    if b.metrics_url is not None:
        murl = _url(b.metrics_url)
        if murl is None or murl.scheme not in ("http", "https") or not murl.hostname:
            err(f"{p}.metrics_url", f"must be an http(s) URL, got {b.metrics_url!r}")
    err.positive(b, p, "metrics_interval_ms", "max_queue")
    if not 0.0 < b.max_kv_cache <= 1.0:
        err(f"{p}.max_kv_cache", f"must be within 0..1 (above 0), got {b.max_kv_cache}")


def _check_routes(routes: tuple[RouteConfig, ...], backends: set[str], err: _Errors) -> None:
    if not routes:
        err("routes", "at least one [[routes]] table is required")
    for i, r in enumerate(routes):
        p = f"routes[{i}]"
        if not r.models:
            err(f"{p}.models", "must list at least one model pattern")
        for j, pat in enumerate(r.models):
            if not pat:
                err(f"{p}.models[{j}]", "empty pattern")
        if not r.backends:
            err(f"{p}.backends", "must list at least one backend")
        for j, name in enumerate(r.backends):
            if name not in backends:
                err(f"{p}.backends[{j}]", f"no backend named {name!r}")
        err.positive(r, p, "retries", allow_zero=True)
        err.positive(r, p, "response_affinity_ttl_s")
        err.positive(r, p, "object_ttl_s")
        for name in ("max_tokens_cap", "history_window"):
            value = getattr(r, name)
            if value is not None and value < 1:
                err(f"{p}.{name}", "must be >= 1")
        _check_weights(r, p, err)


def _check_tokens_fields(cfg: Config, err: _Errors) -> None:
    """A route that sets a missing limit (``max_tokens_cap``) sets one field for all of its
    backends: they must agree on ``max_tokens_field`` (docs/spec.md §12)."""
    fields = {b.name: b.tokens_field for b in cfg.backends}
    for i, r in enumerate(cfg.routes):
        if r.max_tokens_cap is None:
            continue
        used = {fields[n] for n in r.backends if n in fields}
        if len(used) > 1:
            err(
                f"routes[{i}].backends",
                "max_tokens_cap sets one field when the client sent no limit, but these "
                f"backends take different ones ({', '.join(sorted(used))}): set "
                "max_tokens_field on them",
            )


def _check_weights(r: RouteConfig, p: str, err: _Errors) -> None:
    if r.strategy == "weighted":
        if r.weights is None or len(r.weights) != len(r.backends):
            err(f"{p}.weights", "strategy = 'weighted' needs one weight per backend")
        elif any(w <= 0 for w in r.weights) or not all(w == w for w in r.weights):
            err(f"{p}.weights", "every weight must be > 0")
    elif r.weights is not None:
        err(f"{p}.weights", "only used with strategy = 'weighted'")


def _check_edge(edge: EdgeConfig, err: _Errors) -> None:
    for i, net in enumerate(edge.trusted_proxies):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            err(f"edge.trusted_proxies[{i}]", f"not an IP network: {net!r}")
    names: set[str] = set()
    for i, hop in enumerate(edge.hops):
        reserved = ("intake", "auth", "router", "upstream", "gateway", "cache", "backoff")
        if not hop.name or hop.name in reserved:
            err(f"edge.hops[{i}].name", f"{hop.name!r} is empty or reserved")
        elif hop.name in names:
            err(f"edge.hops[{i}].name", f"duplicate hop {hop.name!r}")
        names.add(hop.name)
        if not hop.header:
            err(f"edge.hops[{i}].header", "must name a header")


def _check_cache(c: CacheConfig, err: _Errors) -> None:
    if c.backend == "redis":
        parts = _url(c.url)
        if parts is None or parts.scheme not in ("redis", "rediss", "unix"):
            err("cache.url", f"scheme must be redis, rediss or unix, got {c.url!r}")
    err.positive(c, "cache", "ttl_s", "max_entry_bytes", "max_entries", "max_memory_bytes")
    err.positive(c, "cache", "timeout_ms", "breaker_failures", "breaker_reset_s")
    err.positive(c, "cache", "flight_wait_ms", allow_zero=True)
    if not c.namespace or ":" in c.namespace:
        err("cache.namespace", f"must be non-empty without ':', got {c.namespace!r}")


def _check_tracing(tr: TracingConfig, err: _Errors) -> None:
    if not 0.0 <= tr.sample_ratio <= 1.0:
        err("tracing.sample_ratio", f"must be within 0..1, got {tr.sample_ratio}")
    if tr.endpoint is not None:
        parts = _url(tr.endpoint)
        if parts is None or parts.scheme not in ("http", "https"):
            err("tracing.endpoint", f"must be an http(s) URL, got {tr.endpoint!r}")
    err.positive(tr, "tracing", "max_queue_size", "max_export_batch_size", "schedule_delay_ms")
    err.positive(tr, "tracing", "export_timeout_s", "shutdown_timeout_s")
    if tr.max_export_batch_size > tr.max_queue_size:
        err("tracing.max_export_batch_size", "must not exceed tracing.max_queue_size")


def _check_auth(a: AuthConfig, err: _Errors) -> None:
    if a.redis_url is not None:
        parts = _url(a.redis_url)
        if parts is None or parts.scheme not in ("redis", "rediss", "unix"):
            err("auth.redis_url", f"scheme must be redis, rediss or unix, got {a.redis_url!r}")
    err.positive(a, "auth", "timeout_ms")
    if a.mode == "keys" and not a.keys:
        err("auth.keys", "mode = 'keys' needs at least one [[auth.keys]] entry")
    digests: set[str] = set()
    for i, k in enumerate(a.keys):
        p = f"auth.keys[{i}]"
        if not k.tenant:
            err(f"{p}.tenant", "must not be empty")
        digest = k.sha256.lower()
        if len(digest) != 64 or digest.strip("0123456789abcdef"):
            err(f"{p}.sha256", "must be a sha256 hex digest (gateway hash-key KEY)")
        elif digest in digests:
            err(f"{p}.sha256", "the same key is listed twice")
        digests.add(digest)
        if not k.models or not all(k.models):
            err(f"{p}.models", "must list at least one non-empty model glob")
        for name in ("rpm", "tpm"):
            value = getattr(k, name)
            if value is not None and value < 1:
                err(f"{p}.{name}", "must be >= 1")
        if k.budget_usd is not None and not k.budget_usd > 0:
            err(f"{p}.budget_usd", "must be > 0")
        _check_passthrough(k.passthrough, f"{p}.passthrough", err)
    _check_tenants(a, err)


def _check_passthrough(globs: tuple[str, ...] | None, p: str, err: _Errors) -> None:
    """Path globs (docs/spec.md §26): each a whole path, so it starts with "/" (or is "*")."""
    for glob in globs or ():
        if not glob.startswith(("/", "*")):
            err(p, f"each entry is a path glob starting with '/' (or '*'), got {glob!r}")


def _check_tenants(a: AuthConfig, err: _Errors) -> None:
    names: set[str] = set()
    for i, t in enumerate(a.tenants):
        p = f"auth.tenants[{i}]"
        if not t.name:
            err(f"{p}.name", "must not be empty")
        elif t.name in names:
            err(f"{p}.name", f"duplicate tenant {t.name!r}")
        names.add(t.name)
        if t.budget_usd is not None and not t.budget_usd > 0:
            err(f"{p}.budget_usd", "must be > 0")
        _check_passthrough(t.passthrough, f"{p}.passthrough", err)


def _check_prices(prices: tuple[PriceConfig, ...], err: _Errors) -> None:
    for i, price in enumerate(prices):
        p = f"prices[{i}]"
        if not price.models or not all(price.models):
            err(f"{p}.models", "must list at least one non-empty model glob")
        for name in ("input", "output", "cached_input", "cache_write"):
            value = getattr(price, name)
            if value is not None and not value >= 0:
                err(f"{p}.{name}", "must be >= 0 (USD per 1M tokens)")
        if not 0 <= price.batch_discount <= 1:
            err(f"{p}.batch_discount", "must be between 0 and 1 (a fraction of the list price)")


def _check_ui(ui: UiConfig, err: _Errors) -> None:
    if not ui.path.startswith("/") or not ui.path.endswith("/") or len(ui.path) < 3:
        err("ui.path", f"must start and end with '/', e.g. '/_gateway/', got {ui.path!r}")
    elif ui.path.startswith("/v1/") or ui.path in ("/healthz/", "/readyz/", "/metrics/"):
        err("ui.path", f"must not shadow the gateway's own endpoints, got {ui.path!r}")
    elif not is_canonical(ui.path[:-1].encode("utf-8", "surrogateescape")):
        # requests are routed by their canonical target (docs/spec.md §25)
        err("ui.path", f"must be a path in its canonical form (§25), got {ui.path!r}")
    err.positive(ui, "ui", "recent")


def _check_mcp_servers(servers: tuple[McpServerConfig, ...], err: _Errors) -> None:
    names: set[str] = set()
    for i, m in enumerate(servers):
        p = f"mcp_servers[{i}]"
        if not m.name or not m.name.replace("-", "_").isidentifier() or "__" in m.name:
            err(f"{p}.name", f"letters, digits, '-' and single '_' only, got {m.name!r}")
        elif m.name in names:
            err(f"{p}.name", f"duplicate MCP server {m.name!r}")
        names.add(m.name)
        parts = _url(m.url)
        if parts is None or parts.scheme not in ("http", "https", "mock"):
            err(f"{p}.url", f"scheme must be http, https or mock, got {m.url!r}")
        elif parts.scheme != "mock" and not parts.hostname:
            err(f"{p}.url", f"has no host: {m.url!r}")
        for j, spec in enumerate(m.headers_env):
            header, _, var = spec.partition("=")
            if not header.strip() or not var.strip():
                err(f"{p}.headers_env[{j}]", f"must be 'Header-Name=ENV_VAR', got {spec!r}")
        err.positive(m, p, "timeout_s", "max_message_bytes")
