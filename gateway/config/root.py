"""The whole configuration: :class:`Config`, one field per section (the sections'
dataclasses are their families' modules)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.config.accounts import AuthConfig, PriceConfig
from gateway.config.admin import AdminConfig
from gateway.config.agents import AgentConfig
from gateway.config.backends import BackendConfig, RouteConfig
from gateway.config.features import CacheConfig, McpServerConfig, RealtimeConfig
from gateway.config.listening import EdgeConfig, ServerConfig
from gateway.config.observability import LoggingConfig, MetricsConfig, TracingConfig, UiConfig


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
    #: the key store and the admin API (docs/spec.md §28)
    admin: AdminConfig = field(default_factory=AdminConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    prices: tuple[PriceConfig, ...] = ()
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    mcp_servers: tuple[McpServerConfig, ...] = ()
    #: A2A agents behind /a2a/{name} (docs/spec.md §30)
    agents: tuple[AgentConfig, ...] = ()
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


__all__ = ["Config"]
