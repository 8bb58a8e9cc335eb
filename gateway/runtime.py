"""The Runtime: everything a request needs, one immutable snapshot of the config.

Per-request state lives in the request's context (:mod:`gateway.context`), never here
(docs/architecture.md, habit 2): the runtime holds only what is shared and made once — pooled
transports, the router, the cache, telemetry.

A config reload (docs/spec.md §29) builds a new snapshot from the parts a config derives —
routes, backends and their pools, prices, keys, sign-in grants, passive health, the load
scrapers — while what lives as long as the process is built once, in :class:`Services`, and
carried into every snapshot: tracing and its exporter, the metrics, the access log, the response
cache, the response-owner stores, the limiter's state, the JWK Sets and their fetchers, the live
view's ring buffer, the open realtime sessions. A backend whose config did not change keeps its
pool (the same :class:`~gateway.routes.Backend`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field

from gateway.budgets.limits import Limits
from gateway.budgets.memory_limits import MemoryLimits
from gateway.cache.service import ResponseCache, make_store
from gateway.config import Config
from gateway.context import LiveSession
from gateway.fleet.health import Health
from gateway.fleet.load import Fleet
from gateway.hops.auth import Auth, build_auth, build_limits
from gateway.hops.edge import RequestEdge
from gateway.hops.ownership import Ownership, build_ownership
from gateway.hops.router import Router
from gateway.hops.stored_keys import StoredEntries
from gateway.hops.upstream import Upstream
from gateway.identities import KeySets
from gateway.keys import KeyService, build_key_service
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


@dataclass(slots=True)
class Services:
    """What a process keeps across config reloads (see the module): built once, from the
    settings a reload cannot change, started and closed with the process."""

    config: Config
    #: tracing, access log, metrics and the loop's lag, with no sinks (each snapshot adds its own)
    telemetry: Telemetry
    cache: ResponseCache
    #: the response-owner stores; each snapshot names its own backends over them
    ownership: Ownership
    key_sets: KeySets
    exposition: Exposition | None = None
    recent: RecentRequests | None = None
    sessions: dict[int, LiveSession] = field(default_factory=dict)
    #: the limiter in Redis, made when a config first needs it, then kept (its state with it)
    redis_limits: Limits | None = None
    #: the per-process limiter (its buckets and budgets survive a reload)
    memory_limits: Limits = field(default_factory=MemoryLimits)
    #: the snapshot serving now (what the gauges read)
    current: Runtime | None = None
    #: the key store and its in-memory index (docs/spec.md §28; None: no [admin])
    keys: KeyService | None = None

    def limits_for(self, config: Config, env: Mapping[str, str]) -> Limits:
        if self.redis_limits is None:
            self.redis_limits = build_limits(config, env)
        return self.redis_limits if self.redis_limits is not None else self.memory_limits

    def start(self) -> None:
        self.telemetry.start()
        if self.exposition is not None:
            self.exposition.start()
        self.key_sets.start()  # the JWK Sets fetched in the background (docs/spec.md §29)

    async def aclose(self) -> None:
        if self.exposition is not None:
            await self.exposition.stop()
        if self.recent is not None:
            self.recent.close()  # end the live view's feeds
        await self.key_sets.aclose()
        if self.keys is not None:
            await self.keys.aclose()
        await self.cache.aclose()
        for limits in (self.redis_limits, self.memory_limits):
            if limits is not None:
                await limits.aclose()
        await self.ownership.aclose()
        self.telemetry.stop()  # on the loop: the lag monitor's timer belongs to it
        # the export thread may wait on a dead collector: keep the loop free meanwhile
        await asyncio.to_thread(self.telemetry.shutdown)


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
    #: what outlives this snapshot (None: a runtime built alone, which owns everything)
    services: Services | None = None
    #: closed when this snapshot is retired and idle: what was built for it on first use
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def request(self, scope: Scope, send: Send, vary: bool = False) -> RequestScope:
        """The scope of one request (begin → errors → 499 → finish): ``async with`` it."""
        return RequestScope(self.edge, self.telemetry, scope, send, vary)

    @property
    def tracing(self) -> Tracing:
        return self.telemetry.tracing

    async def start(self) -> None:
        """Background work of a started runtime (the event loop's lag, the metrics snapshots
        of workers > 1, the JWK Sets; the load scrapers of its backends)."""
        if self.services is not None and self.services.current is None:
            self.services.start()
            await self.services.key_sets.ready()  # the issuers' keys, before listening
            if self.services.keys is not None:  # the key store's keys, read once, then followed
                await self.services.keys.start()
        self.begin()

    def begin(self) -> None:
        """This snapshot's own background work, as it starts serving."""
        if self.services is not None:
            self.services.current = self
        if self.fleet is not None:
            self.fleet.start()  # one scraper task per backend, off the request path

    async def retire(self, held: Collection[int] = ()) -> None:
        """Close what this snapshot alone holds, once its last request is over: its scrapers,
        the pools of its backends no live snapshot holds (``held``: their ids), what was
        built for it on first use (its MCP servers' clients)."""
        if self.fleet is not None:
            await self.fleet.aclose()
        await self.auth.drain()  # its last settlements, on the limiter the process keeps
        await asyncio.gather(
            *(b.transport.aclose() for b in self.backends.values() if id(b) not in held),
            *(close() for close in self.closers),
            return_exceptions=True,
        )

    async def aclose(self) -> None:
        await self.retire()
        await self.auth.drain()  # the last token debits
        if self.services is not None:
            await self.services.aclose()


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


def _backends(
    config: Config, env: Mapping[str, str], previous: Runtime | None = None
) -> dict[str, Backend]:
    """A backend per ``[[backends]]``; one whose config (and key) did not change since
    ``previous`` is that very backend, its pool kept (docs/spec.md §29)."""
    backends: dict[str, Backend] = {}
    before = previous.backends if previous is not None else {}
    for cfg in config.backends:
        old = before.get(cfg.name)
        if old is not None and old.config == cfg:  # the environment is the process's own
            backends[cfg.name] = old
            continue
        if cfg.api_key_env and not env.get(cfg.api_key_env):
            log.warning(
                "backend %s: env var %s is not set; no key is sent upstream",
                cfg.name,
                cfg.api_key_env,
            )
        backends[cfg.name] = Backend(cfg, for_backend(cfg), env)
    return backends


def _gauges(services: Services) -> dict[str, dict[tuple[str, ...], float]]:
    """The gauges of the snapshot serving now (scraped, never per request)."""
    rt = services.current
    if rt is None:
        return {}
    health, auth = rt.health, rt.auth
    return {
        # passive health is per process: 1 in rotation, 0 ejected (or probing)
        "gateway_backend_up": {(name,): float(health.up(name)) for name in rt.backends},
        # 1 while limits count per process because their Redis is unreachable
        "gateway_ratelimit_fallback": {(): float(auth.fallback)},
        "gateway_budget_used_ratio": auth.budget_ratios(),  # as this process saw it
        # the model servers' load as this process last scraped it (docs/spec.md §21)
        **health.load_gauges(),
    }


def build_services(config: Config, environ: Mapping[str, str] | None = None) -> Services:
    """What the process keeps across reloads (:class:`Services`), from ``config``."""
    env = os.environ if environ is None else environ
    tracing = Tracing(
        config.tracing,
        edge_hop_count=len(config.edge.hops),
        cache_backend=config.cache.backend,
        auth_mode=config.auth.mode,
    )
    metrics = exposition = None
    if config.metrics.enabled:
        metrics = Metrics({r.name: r.models for r in config.routes}, lambda: _gauges(services))
        shared = env.get(METRICS_DIR_ENV)  # workers > 1: `gateway serve` made it
        exposition = Exposition(metrics, WorkerSnapshots(shared, metrics) if shared else None)
    recent = None
    if config.ui.enabled:
        content = tracing.content  # the live view shows text only when spans may carry it
        recent = RecentRequests(config.ui.recent, capture=content if content.full else None)
    services = Services(
        config=config,
        telemetry=Telemetry(tracing, AccessLog(config.logging), metrics=metrics),
        cache=ResponseCache(config.cache, make_store(config.cache)),
        ownership=build_ownership(config, {}, env),
        key_sets=KeySets(),
        exposition=exposition,
        recent=recent,
        keys=build_key_service(config, env),
    )
    return services


def build_runtime(
    config: Config,
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
    previous: Runtime | None = None,
) -> Runtime:
    """A snapshot of ``config`` over ``services`` (made here when not given): pools (those of
    ``previous`` whose backend did not change), router, auth, passive health, telemetry's
    sinks. The cache connects lazily: a dead Redis never stops a start."""
    env = os.environ if environ is None else environ
    if services is None:
        logging.getLogger("gateway").setLevel(config.logging.level.upper())
        services = build_services(config, env)
    auth = build_auth(config, env, services.limits_for(config, env), services.key_sets)
    if services.keys is not None and auth.mode == "keys":  # docs/spec.md §28
        tenants = config.auth.tenants
        auth.stored = StoredEntries(services.keys.index, auth.tenant_budgets, tenants)
    base = services.telemetry
    backends = _backends(config, env, previous)
    routes = tuple(Route(r, tuple(backends[n] for n in r.backends)) for r in config.routes)
    health = Health(backends.values(), routes)
    fleet = Fleet(backends.values(), health.publish)
    if base.metrics is not None and previous is not None:
        base.metrics.use_routes({r.name: r.models for r in config.routes})
    services.key_sets.keep({j.jwks_url for j in config.auth.jwt})
    return Runtime(
        config=config,
        edge=RequestEdge(config.edge),
        auth=auth,
        router=Router(routes),
        upstream=_upstream(base.tracing, health),
        backends=backends,
        cache=services.cache,
        telemetry=base.with_sinks(_sinks(health, auth, services.recent)),
        max_body=config.server.max_body_bytes,
        exposition=services.exposition,
        recent=services.recent,
        health=health,
        ownership=services.ownership.for_backends(backends),
        fleet=fleet if fleet.scrapers else None,
        sessions=services.sessions,
        services=services,
    )
