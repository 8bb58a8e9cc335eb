"""The checks a value's type cannot make: ranges, URLs, names unique, what one key asks of
another (a route's backends exist, weights match them, one ``max_tokens`` field per capped
route), each problem under its key path (docs/spec.md §4)."""

from __future__ import annotations

import ipaddress
import re

from gateway.config.accounts import AuthConfig, PriceConfig
from gateway.config.admin import check_admin
from gateway.config.agents import check_agents
from gateway.config.backends import BackendConfig, RouteConfig, split_url
from gateway.config.features import CacheConfig, McpServerConfig
from gateway.config.identities import check_jwt
from gateway.config.key_paths import KeyPathErrors
from gateway.config.listening import EdgeConfig, ServerConfig
from gateway.config.observability import TracingConfig, UiConfig, keep_rule
from gateway.config.root import Config
from gateway.origins import check_entries
from gateway.target import is_canonical


def validate(cfg: Config, errors: list[str]) -> None:
    err = KeyPathErrors(errors)
    _check_server(cfg.server, err)
    names = _check_backends(cfg.backends, err)
    _check_routes(cfg.routes, names, err)
    _check_tokens_fields(cfg, err)
    _check_edge(cfg.edge, err)
    _check_cache(cfg.cache, err)
    _check_tracing(cfg.tracing, err)
    if not 0.0 <= cfg.logging.sample_ratio <= 1.0:
        err("logging.sample_ratio", f"must be within 0..1, got {cfg.logging.sample_ratio}")
    _check_auth(cfg.auth, err, admin=cfg.admin.enabled(False))
    admin_jwt = any(j.admin_groups for j in cfg.auth.jwt)
    on = cfg.auth.mode == "keys" and cfg.admin.enabled(admin_jwt)
    check_admin(cfg.admin, err, port=cfg.server.port, on=on)
    if cfg.admin.store == "redis" and cfg.auth.redis_url is None and cfg.cache.backend != "redis":
        err("admin.store", "'redis' needs a shared Redis: auth.redis_url or a Redis [cache]")
    _check_ui(cfg.ui, err)
    _check_prices(cfg.prices, err)
    err.positive(cfg.realtime, "realtime", "max_message_bytes", "idle_timeout_s", "max_session_s")
    _check_mcp_servers(cfg.mcp_servers, err)
    check_agents(cfg.agents, err)


def _check_server(s: ServerConfig, err: KeyPathErrors) -> None:
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


def _check_tls_http2(s: ServerConfig, err: KeyPathErrors) -> None:
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


def _check_backends(backends: tuple[BackendConfig, ...], err: KeyPathErrors) -> set[str]:
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
        parts = split_url(b.url)
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


def _check_backend_load(b: BackendConfig, p: str, err: KeyPathErrors) -> None:
    if b.metrics_url is not None:
        murl = split_url(b.metrics_url)
        if murl is None or murl.scheme not in ("http", "https") or not murl.hostname:
            err(f"{p}.metrics_url", f"must be an http(s) URL, got {b.metrics_url!r}")
    err.positive(b, p, "metrics_interval_ms", "max_queue")
    if not 0.0 < b.max_kv_cache <= 1.0:
        err(f"{p}.max_kv_cache", f"must be within 0..1 (above 0), got {b.max_kv_cache}")


def _check_routes(routes: tuple[RouteConfig, ...], backends: set[str], err: KeyPathErrors) -> None:
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


def _check_tokens_fields(cfg: Config, err: KeyPathErrors) -> None:
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


def _check_weights(r: RouteConfig, p: str, err: KeyPathErrors) -> None:
    if r.strategy == "weighted":
        if r.weights is None or len(r.weights) != len(r.backends):
            err(f"{p}.weights", "strategy = 'weighted' needs one weight per backend")
        elif any(w <= 0 for w in r.weights) or not all(w == w for w in r.weights):
            err(f"{p}.weights", "every weight must be > 0")
    elif r.weights is not None:
        err(f"{p}.weights", "only used with strategy = 'weighted'")


def _check_edge(edge: EdgeConfig, err: KeyPathErrors) -> None:
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


def _check_cache(c: CacheConfig, err: KeyPathErrors) -> None:
    if c.backend == "redis":
        parts = split_url(c.url)
        if parts is None or parts.scheme not in ("redis", "rediss", "unix"):
            err("cache.url", f"scheme must be redis, rediss or unix, got {c.url!r}")
    err.positive(c, "cache", "ttl_s", "max_entry_bytes", "max_entries", "max_memory_bytes")
    err.positive(c, "cache", "timeout_ms", "breaker_failures", "breaker_reset_s")
    err.positive(c, "cache", "flight_wait_ms", allow_zero=True)
    if not c.namespace or ":" in c.namespace:
        err("cache.namespace", f"must be non-empty without ':', got {c.namespace!r}")


def _check_tracing(tr: TracingConfig, err: KeyPathErrors) -> None:
    if not 0.0 <= tr.sample_ratio <= 1.0:
        err("tracing.sample_ratio", f"must be within 0..1, got {tr.sample_ratio}")
    if tr.endpoint is not None:
        parts = split_url(tr.endpoint)
        if parts is None or parts.scheme not in ("http", "https"):
            err("tracing.endpoint", f"must be an http(s) URL, got {tr.endpoint!r}")
    err.positive(tr, "tracing", "max_queue_size", "max_export_batch_size", "schedule_delay_ms")
    err.positive(tr, "tracing", "export_timeout_s", "shutdown_timeout_s")
    if tr.max_export_batch_size > tr.max_queue_size:
        err("tracing.max_export_batch_size", "must not exceed tracing.max_queue_size")
    err.positive(tr, "tracing", "capture_max_bytes", "metrics_interval_s")
    for i, rule in enumerate(tr.keep):
        try:
            keep_rule(rule)
        except ValueError as exc:
            err(f"tracing.keep[{i}]", str(exc))
    for i, pattern in enumerate(tr.redact):
        try:
            if re.compile(pattern).fullmatch(""):
                err(f"tracing.redact[{i}]", "must not match the empty string")
        except re.error as exc:
            err(f"tracing.redact[{i}]", f"not a regular expression: {exc}")


def _check_auth(a: AuthConfig, err: KeyPathErrors, admin: bool = False) -> None:
    if a.redis_url is not None:
        parts = split_url(a.redis_url)
        if parts is None or parts.scheme not in ("redis", "rediss", "unix"):
            err("auth.redis_url", f"scheme must be redis, rediss or unix, got {a.redis_url!r}")
    err.positive(a, "auth", "timeout_ms")
    if a.mode == "keys" and not a.keys and not a.jwt and not admin:
        err(
            "auth.keys",
            "mode = 'keys' needs at least one [[auth.keys]] or [[auth.jwt]] entry, or an "
            "[admin] key_env to make keys with",
        )
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
    check_jwt(a.jwt, err)


def _check_passthrough(globs: tuple[str, ...] | None, p: str, err: KeyPathErrors) -> None:
    """Path globs (docs/spec.md §26): each a whole path, so it starts with "/" (or is "*")."""
    for glob in globs or ():
        if not glob.startswith(("/", "*")):
            err(p, f"each entry is a path glob starting with '/' (or '*'), got {glob!r}")


def _check_tenants(a: AuthConfig, err: KeyPathErrors) -> None:
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


def _check_prices(prices: tuple[PriceConfig, ...], err: KeyPathErrors) -> None:
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


def _check_ui(ui: UiConfig, err: KeyPathErrors) -> None:
    if not ui.path.startswith("/") or not ui.path.endswith("/") or len(ui.path) < 3:
        err("ui.path", f"must start and end with '/', e.g. '/_gateway/', got {ui.path!r}")
    elif ui.path.startswith("/v1/") or ui.path in ("/healthz/", "/readyz/", "/metrics/"):
        err("ui.path", f"must not shadow the gateway's own endpoints, got {ui.path!r}")
    elif not is_canonical(ui.path[:-1].encode("utf-8", "surrogateescape")):
        # requests are routed by their canonical target (docs/spec.md §25)
        err("ui.path", f"must be a path in its canonical form (§25), got {ui.path!r}")
    err.positive(ui, "ui", "recent")


def _check_mcp_servers(servers: tuple[McpServerConfig, ...], err: KeyPathErrors) -> None:
    names: set[str] = set()
    for i, m in enumerate(servers):
        p = f"mcp_servers[{i}]"
        if not m.name or not m.name.replace("-", "_").isidentifier() or "__" in m.name:
            err(f"{p}.name", f"letters, digits, '-' and single '_' only, got {m.name!r}")
        elif m.name in names:
            err(f"{p}.name", f"duplicate MCP server {m.name!r}")
        names.add(m.name)
        parts = split_url(m.url)
        if parts is None or parts.scheme not in ("http", "https", "mock"):
            err(f"{p}.url", f"scheme must be http, https or mock, got {m.url!r}")
        elif parts.scheme != "mock" and not parts.hostname:
            err(f"{p}.url", f"has no host: {m.url!r}")
        for j, spec in enumerate(m.headers_env):
            header, _, var = spec.partition("=")
            if not header.strip() or not var.strip():
                err(f"{p}.headers_env[{j}]", f"must be 'Header-Name=ENV_VAR', got {spec!r}")
        err.positive(m, p, "timeout_s", "max_message_bytes")


__all__ = ["validate"]
