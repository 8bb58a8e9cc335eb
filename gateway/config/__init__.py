"""Typed settings: TOML file + ``GATEWAY__SECTION__KEY`` environment overrides (docs/spec.md §3,
§4).

Every section is a frozen dataclass, in the module of its family: :mod:`.listening` (server,
edge), :mod:`.backends` (backends, routes), :mod:`.accounts` (auth keys, tenants, prices),
:mod:`.observability` (tracing, logging, metrics, the live view), :mod:`.features` (cache,
realtime, MCP servers), :mod:`.agents` (A2A agents), the whole in :mod:`.root`.
:func:`load_config` (:mod:`.loader`)
applies the overrides (:mod:`.overrides`), builds the sections from plain data
(:mod:`.convert`), checks what types cannot (:mod:`.checks`) and collects *every* problem as
``path.to.key: message`` (:mod:`.key_paths`; unknown keys included), so ``gateway check-config``
can print them all at once. Everything is imported from here: ``from gateway.config import
Config, load_config``.

>>> cfg = load_config(env={"GATEWAY__SERVER__PORT": "9000"})  # the embedded default + env
>>> cfg.server.port, cfg.backends[0].url
(9000, 'mock://')
"""

from gateway.config.accounts import AuthConfig, AuthKeyConfig, PriceConfig, TenantConfig
from gateway.config.admin import AdminConfig
from gateway.config.agents import AgentConfig
from gateway.config.backends import BackendConfig, RouteConfig
from gateway.config.features import CacheConfig, McpServerConfig, RealtimeConfig
from gateway.config.identities import ASYMMETRIC, JwtGrantConfig, JwtIssuerConfig
from gateway.config.key_paths import ConfigError
from gateway.config.listening import (
    EdgeConfig,
    EdgeHopConfig,
    Http2Config,
    ServerConfig,
    TlsConfig,
)
from gateway.config.loader import (
    CONFIG_ENV,
    build_config,
    default_config_text,
    is_loopback,
    load_config,
)
from gateway.config.observability import LoggingConfig, MetricsConfig, TracingConfig, UiConfig
from gateway.config.overrides import ENV_PREFIX
from gateway.config.root import Config

__all__ = [
    "ASYMMETRIC",
    "CONFIG_ENV",
    "ENV_PREFIX",
    "AdminConfig",
    "AgentConfig",
    "AuthConfig",
    "AuthKeyConfig",
    "BackendConfig",
    "CacheConfig",
    "Config",
    "ConfigError",
    "EdgeConfig",
    "EdgeHopConfig",
    "Http2Config",
    "JwtGrantConfig",
    "JwtIssuerConfig",
    "LoggingConfig",
    "McpServerConfig",
    "MetricsConfig",
    "PriceConfig",
    "RealtimeConfig",
    "RouteConfig",
    "ServerConfig",
    "TenantConfig",
    "TlsConfig",
    "TracingConfig",
    "UiConfig",
    "build_config",
    "default_config_text",
    "is_loopback",
    "load_config",
]
