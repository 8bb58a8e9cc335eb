"""Typed settings: TOML file + ``GATEWAY__SECTION__KEY`` environment overrides (SPEC §3, §4).

Every section is a frozen dataclass; :func:`load_config` builds them from plain data and
collects *every* problem as ``path.to.key: message`` (unknown keys included), so
``gateway check-config`` can print them all at once.

>>> cfg = load_config(text='[server]\\nport = 9000', env={})
>>> cfg.server.port
9000
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
from urllib.parse import urlsplit

ENV_PREFIX = "GATEWAY__"
CONFIG_ENV = "GATEWAY_CONFIG"


class ConfigError(Exception):
    """Raised with every problem found; ``errors`` holds ``path: message`` strings."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ---------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    max_body_bytes: int = 10 * 1024 * 1024
    shutdown_grace_s: float = 30.0


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
    http2: bool = False

    @property
    def is_mock(self) -> bool:
        return self.url.startswith("mock:")


@dataclass(frozen=True, slots=True)
class RouteConfig:
    models: tuple[str, ...]
    backends: tuple[str, ...]
    name: str = ""  # defaults to the first model pattern
    retries: int = 2
    retry_on_timeout: bool = False
    max_tokens_cap: int | None = None
    history_window: int | None = None


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


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    access_log: Literal["all", "sampled", "off"] = "sampled"
    slow_ms: float = 500.0
    sample_ratio: float = 0.01
    level: Literal["debug", "info", "warning", "error"] = "info"


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
    #: where the config came from (a path, or "<embedded default>")
    source: str = field(default="<text>", compare=False)

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
            except OSError as exc:
                raise ConfigError([f"{source}: cannot read: {exc.strerror or exc}"]) from exc
    else:
        source = "<text>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: invalid TOML: {exc}"]) from exc
    errors: list[str] = []
    _apply_env(data, env, errors)
    cfg = _build(Config, data, "", errors)
    if isinstance(cfg, Config):  # keys that failed to build took their defaults: check the rest
        _validate(cfg, errors)
    if errors:
        raise ConfigError(errors)
    assert isinstance(cfg, Config)
    routes = tuple(dataclasses.replace(r, name=r.name or r.models[0]) for r in cfg.routes)
    return dataclasses.replace(cfg, routes=routes, source=source)


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
    """Convert plain TOML data to ``tp``; append ``path: message`` to ``errors`` on problems."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            errors.append(f"{path or '<root>'}: expected a table, got {_tname(value)}")
            return _MISSING
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp) if f.name != "source"}
        for key in value:
            if key not in fields:
                errors.append(f"{_key(path, key)}: unknown key")
        kwargs: dict[str, Any] = {}
        for name, f in fields.items():
            if name in value:
                built = _build(hints[name], value[name], _key(path, name), errors)
                if built is not _MISSING:
                    kwargs[name] = built
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append(f"{_key(path, name)}: required key is missing")
        try:
            return tp(**kwargs)
        except TypeError:
            return _MISSING  # a required field failed; already reported
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(args[0], value, path, errors)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if isinstance(value, _EnvValue):
            value = _parse_env_list(value)
        if not isinstance(value, list):
            errors.append(f"{path}: expected an array, got {_tname(value)}")
            return _MISSING
        items = [_build(item_tp, v, _key(path, i), errors) for i, v in enumerate(value)]
        return tuple(items)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            errors.append(f"{path}: must be one of {choices}, got {value!r}")
            return _MISSING
        return str(value)
    if tp is bool:
        if isinstance(value, _EnvValue):
            low = value.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
        if not isinstance(value, bool):
            errors.append(f"{path}: expected true or false, got {value!r}")
            return _MISSING
        return value
    if tp is int or tp is float:
        if isinstance(value, _EnvValue):
            try:
                value = tp(value)
            except ValueError:
                errors.append(f"{path}: expected a number, got {str(value)!r}")
                return _MISSING
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if tp is int and isinstance(value, float):
            ok = False
        if not ok:
            errors.append(
                f"{path}: expected {'an integer' if tp is int else 'a number'}, got {value!r}"
            )
            return _MISSING
        return tp(value)
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {_tname(value)}")
            return _MISSING
        return str(value)
    raise TypeError(f"config type not handled: {tp!r}")  # pragma: no cover - programming error


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


# ---------------------------------------------------------------- cross-field checks


def _validate(cfg: Config, errors: list[str]) -> None:
    s = cfg.server
    if not 0 < s.port < 65536:
        errors.append(f"server.port: must be 1..65535, got {s.port}")
    if s.workers < 1:
        errors.append(f"server.workers: must be >= 1, got {s.workers}")
    if s.max_body_bytes < 1:
        errors.append(f"server.max_body_bytes: must be > 0, got {s.max_body_bytes}")
    if s.shutdown_grace_s < 0:
        errors.append("server.shutdown_grace_s: must be >= 0")
    if not cfg.backends:
        errors.append("backends: at least one [[backends]] table is required")
    seen: set[str] = set()
    for i, b in enumerate(cfg.backends):
        p = f"backends[{i}]"
        if not b.name:
            errors.append(f"{p}.name: must not be empty")
        if b.name in seen:
            errors.append(f"{p}.name: duplicate backend name {b.name!r}")
        seen.add(b.name)
        parts = urlsplit(b.url)
        if parts.scheme not in ("http", "https", "mock"):
            errors.append(f"{p}.url: scheme must be http, https or mock, got {b.url!r}")
        elif parts.scheme != "mock" and not parts.hostname:
            errors.append(f"{p}.url: has no host: {b.url!r}")
        elif parts.fragment or (parts.query and parts.scheme != "mock"):
            errors.append(f"{p}.url: must not carry a query or fragment: {b.url!r}")
        for name in ("connect_timeout_s", "read_timeout_s", "stream_idle_timeout_s"):
            if getattr(b, name) <= 0:
                errors.append(f"{p}.{name}: must be > 0")
        if b.max_connections < 1:
            errors.append(f"{p}.max_connections: must be >= 1")
        if b.api_key_env is not None and not b.api_key_env:
            errors.append(f"{p}.api_key_env: must name an environment variable")
    if not cfg.routes:
        errors.append("routes: at least one [[routes]] table is required")
    for i, r in enumerate(cfg.routes):
        p = f"routes[{i}]"
        if not r.models:
            errors.append(f"{p}.models: must list at least one model pattern")
        if not r.backends:
            errors.append(f"{p}.backends: must list at least one backend")
        for j, name in enumerate(r.backends):
            if name not in seen:
                errors.append(f"{p}.backends[{j}]: no backend named {name!r}")
        if r.retries < 0:
            errors.append(f"{p}.retries: must be >= 0")
        if r.max_tokens_cap is not None and r.max_tokens_cap < 1:
            errors.append(f"{p}.max_tokens_cap: must be >= 1")
        if r.history_window is not None and r.history_window < 1:
            errors.append(f"{p}.history_window: must be >= 1")
        for j, pat in enumerate(r.models):
            if not pat:
                errors.append(f"{p}.models[{j}]: empty pattern")
    for i, net in enumerate(cfg.edge.trusted_proxies):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            errors.append(f"edge.trusted_proxies[{i}]: not an IP network: {net!r}")
    hop_names: set[str] = set()
    for i, hop in enumerate(cfg.edge.hops):
        if not hop.name or hop.name in ("auth", "router", "upstream", "gateway", "cache"):
            errors.append(f"edge.hops[{i}].name: {hop.name!r} is empty or reserved")
        if hop.name in hop_names:
            errors.append(f"edge.hops[{i}].name: duplicate hop {hop.name!r}")
        hop_names.add(hop.name)
        if not hop.header:
            errors.append(f"edge.hops[{i}].header: must name a header")
    c = cfg.cache
    if c.backend == "redis":
        scheme = urlsplit(c.url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            errors.append(f"cache.url: scheme must be redis, rediss or unix, got {c.url!r}")
    for name in (
        "ttl_s",
        "max_entry_bytes",
        "max_entries",
        "max_memory_bytes",
        "timeout_ms",
        "breaker_failures",
        "breaker_reset_s",
    ):
        if getattr(c, name) <= 0:
            errors.append(f"cache.{name}: must be > 0")
    if c.flight_wait_ms < 0:
        errors.append("cache.flight_wait_ms: must be >= 0")
    if not c.namespace or ":" in c.namespace:
        errors.append(f"cache.namespace: must be non-empty without ':', got {c.namespace!r}")
    tr = cfg.tracing
    if not 0.0 <= tr.sample_ratio <= 1.0:
        errors.append(f"tracing.sample_ratio: must be within 0..1, got {tr.sample_ratio}")
    if tr.endpoint is not None and urlsplit(tr.endpoint).scheme not in ("http", "https"):
        errors.append(f"tracing.endpoint: must be an http(s) URL, got {tr.endpoint!r}")
    for name in (
        "max_queue_size",
        "max_export_batch_size",
        "schedule_delay_ms",
        "export_timeout_s",
        "shutdown_timeout_s",
    ):
        if getattr(tr, name) <= 0:
            errors.append(f"tracing.{name}: must be > 0")
    if tr.max_export_batch_size > tr.max_queue_size:
        errors.append("tracing.max_export_batch_size: must not exceed tracing.max_queue_size")
    lg = cfg.logging
    if not 0.0 <= lg.sample_ratio <= 1.0:
        errors.append(f"logging.sample_ratio: must be within 0..1, got {lg.sample_ratio}")
