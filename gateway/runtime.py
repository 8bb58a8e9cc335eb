"""The Runtime: everything a request needs, built once in the lifespan, never changed after.

Per-request state lives in the request's context (:mod:`gateway.context`), never here
(docs/architecture.md, habit 2): the runtime holds only what is shared and made once — pooled
transports,
the router, the cache, telemetry.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from gateway.cache.service import ResponseCache, make_store
from gateway.config import Config
from gateway.context import LiveSession
from gateway.fleet.health import Health
from gateway.fleet.load import Fleet
from gateway.hops.auth import Auth, build_auth
from gateway.hops.edge import RequestEdge
from gateway.hops.ownership import Ownership, build_ownership
from gateway.hops.router import Router
from gateway.hops.upstream import Upstream
from gateway.live.recent import RecentRequests
from gateway.routes import Backend, Route
from gateway.scope import RequestScope
from gateway.telemetry import Sink, Telemetry
from gateway.telemetry.logs import AccessLog
from gateway.telemetry.metrics import METRICS_DIR_ENV, Exposition, Metrics, WorkerSnapshots
from gateway.telemetry.tracing import Tracing
from gateway.transports import for_backend
from gateway.types import Receive, Scope, Send

#: what the app dispatches a path to (endpoints, the model call, the live view)
Endpoint = Callable[["Runtime", Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class Runtime:
    config: Config
    edge: RequestEdge
    auth: Auth
    router: Router
    upstream: Upstream
    backends: Mapping[str, Backend]
    cache: ResponseCache
    telemetry: Telemetry
    #: passive health, retry budgets, strategies (docs/spec.md §13); per process
    health: Health
    #: response id -> the backend that made it (stateful Responses, docs/spec.md §22)
    ownership: Ownership
    max_body: int
    #: GET /metrics (None with [metrics] enabled = false)
    exposition: Exposition | None = None
    #: the live view's ring buffer (None with [ui] enabled = false)
    recent: RecentRequests | None = None
    #: the model servers' load scrapers (docs/spec.md §21; None: no backend reports load)
    fleet: Fleet | None = None
    #: open realtime sessions (docs/spec.md §19), for the live view; keyed by the session
    #: object's id (clients choose x-request-id: two sessions may share one)
    sessions: dict[int, LiveSession] = field(default_factory=dict)

    def request(self, scope: Scope, send: Send, vary: bool = False) -> RequestScope:
        """The scope of one request (begin → errors → 499 → finish): ``async with`` it."""
        return RequestScope(self.edge, self.telemetry, scope, send, vary)

    @property
    def tracing(self) -> Tracing:
        return self.telemetry.tracing

    async def start(self) -> None:
        """Background work of a started runtime (the event loop's lag, the metrics snapshots
        of workers > 1)."""
        self.telemetry.start()
        if self.exposition is not None:
            self.exposition.start()
        if self.fleet is not None:
            self.fleet.start()  # one scraper task per backend, off the request path

    async def aclose(self) -> None:
        if self.exposition is not None:
            await self.exposition.stop()
        if self.fleet is not None:
            await self.fleet.aclose()
        if self.recent is not None:
            self.recent.close()  # end the live view's feeds
        await asyncio.gather(
            *(b.transport.aclose() for b in self.backends.values()), return_exceptions=True
        )
        await self.cache.aclose()
        await self.auth.aclose()  # the last token debits, the limiter's Redis client
        await self.ownership.aclose()
        self.telemetry.stop()  # on the loop: the lag monitor's timer belongs to it
        # the export thread may wait on a dead collector: keep the loop free meanwhile
        await asyncio.to_thread(self.telemetry.shutdown)


def _upstream(tracing: Tracing, health: Health) -> Upstream:
    if not tracing.enabled:  # no per-attempt header hook and no span ids: a bare attempt path
        return Upstream(health=health)
    # under opentelemetry-instrument the attempt is the current span while its client runs
    scope = tracing.attempt_current if tracing.auto_instrumented() else None
    return Upstream(tracing.attempt_headers, tracing.new_span_id, scope, health)


def _sinks(health: Health, auth: Auth, recent: RecentRequests | None) -> tuple[Sink, ...]:
    """Who is told about each finished request besides spans, metrics and the access log."""
    sinks: list[Sink] = [health.finished]
    if auth.debits:  # tokens per minute: debit the usage the upstream reported
        sinks.append(auth.finished)
    if recent is not None:
        sinks.append(recent)
    return tuple(sinks)


def _backends(config: Config, env: Mapping[str, str]) -> dict[str, Backend]:
    backends: dict[str, Backend] = {}
    for cfg in config.backends:
        if cfg.api_key_env and not env.get(cfg.api_key_env):
            log.warning(
                "backend %s: env var %s is not set; no key is sent upstream",
                cfg.name,
                cfg.api_key_env,
            )
        backends[cfg.name] = Backend(cfg, for_backend(cfg), env)
    return backends


def _metrics(
    config: Config,
    env: Mapping[str, str],
    health: Health,
    auth: Auth,
    backends: Mapping[str, Backend],
) -> tuple[Metrics | None, Exposition | None]:
    """The metrics of this process and GET /metrics (none with [metrics] enabled = false)."""
    if not config.metrics.enabled:
        return None, None
    metrics = Metrics(
        {r.name: r.models for r in config.routes},
        lambda: {
            # passive health is per process: 1 in rotation, 0 ejected (or probing)
            "gateway_backend_up": {(name,): float(health.up(name)) for name in backends},
            # 1 while limits count per process because their Redis is unreachable
            "gateway_ratelimit_fallback": {(): float(auth.fallback)},
            "gateway_budget_used_ratio": auth.budget_ratios(),  # as this process saw it
            # the model servers' load as this process last scraped it (docs/spec.md §21)
            **health.load_gauges(),
        },
    )
    shared = env.get(METRICS_DIR_ENV)  # workers > 1: `gateway serve` made it
    return metrics, Exposition(metrics, WorkerSnapshots(shared, metrics) if shared else None)


def build_runtime(config: Config, environ: Mapping[str, str] | None = None) -> Runtime:
    """Pools, router, cache (it connects lazily: a dead Redis never stops a start), telemetry."""
    env = os.environ if environ is None else environ
    logging.getLogger("gateway").setLevel(config.logging.level.upper())
    auth = build_auth(config, env)
    tracing = Tracing(
        config.tracing,
        edge_hop_count=len(config.edge.hops),
        cache_backend=config.cache.backend,
        auth_mode=auth.mode,
    )
    backends = _backends(config, env)
    routes = tuple(Route(r, tuple(backends[n] for n in r.backends)) for r in config.routes)
    health = Health(backends.values(), routes)
    fleet = Fleet(backends.values(), health.publish)
    upstream = _upstream(tracing, health)
    metrics, exposition = _metrics(config, env, health, auth, backends)
    recent = None
    if config.ui.enabled:
        content = tracing.content  # the live view shows text only when spans may carry it
        recent = RecentRequests(config.ui.recent, capture=content if content.full else None)
    return Runtime(
        config=config,
        edge=RequestEdge(config.edge),
        auth=auth,
        router=Router(routes),
        upstream=upstream,
        backends=backends,
        cache=ResponseCache(config.cache, make_store(config.cache)),
        telemetry=Telemetry(
            tracing,
            AccessLog(config.logging),
            sinks=_sinks(health, auth, recent),
            metrics=metrics,
        ),
        max_body=config.server.max_body_bytes,
        exposition=exposition,
        recent=recent,
        health=health,
        ownership=build_ownership(config, backends, env),
        fleet=fleet if fleet.scrapers else None,
    )
