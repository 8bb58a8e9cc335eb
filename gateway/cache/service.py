"""The response cache as the request path sees it: lookup in the router hop, store after the
response, single flight in between (docs/spec.md §10).

Fail-open by construction: every store call may raise :class:`CacheUnavailable` (Redis dead,
black-holed, breaker open); the request is then served uncached with ``x-gateway-cache:
BYPASS`` and the ``error`` counter moves. The Redis store bounds each call by
``cache.timeout_ms`` and its breaker makes a dead Redis cost no wait at all.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import orjson

from gateway.cache.flight import CONTENT, DONE, USAGE_ONLY, Flight, Flights
from gateway.cache.keys import (
    NO_DIRECTIVES,
    cache_key,
    credential_scope,
    is_cacheable,
    parse_cache_control,
)
from gateway.cache.replay import Entry, StreamCollector
from gateway.cache.store import CacheStore, CacheUnavailable
from gateway.config import CacheConfig
from gateway.memo import remember

if TYPE_CHECKING:
    from gateway.context import Call, RequestContext

#: decoded entries kept for later hits: at most this many, each of at most this many stored
#: bytes. What they add — the body's copy, the compressed forms and synthesised SSE events the
#: entry keeps (cache/replay.py) — is a few times 8 MiB at worst, a few KiB per answer usually
_DECODED_MAX = 256
_DECODED_VALUE_MAX = 32 * 1024
#: the ``Age`` header values of the first hour, made once
_AGES_MADE = 3600
_AGES = tuple(b"%d" % age for age in range(_AGES_MADE))


class CacheStats:
    """Counters for ``gateway_cache_requests_total{result}`` (read by /metrics and /readyz)."""

    __slots__ = ("bypass", "error", "hit", "miss")

    def __init__(self) -> None:
        self.hit = self.miss = self.bypass = self.error = 0

    def as_dict(self) -> dict[str, int]:
        return {"hit": self.hit, "miss": self.miss, "bypass": self.bypass, "error": self.error}


class CachePlan:
    """A miss: the answer goes upstream, and into the store after the response."""

    __slots__ = ("collector", "flight", "key", "lock_token")

    def __init__(self, key: str) -> None:
        self.key = key
        self.flight: Flight | None = None
        self.lock_token: str | None = None
        self.collector: StreamCollector | None = None


class Lookup:
    __slots__ = ("entry", "follow", "plan")

    def __init__(
        self,
        entry: Entry | None = None,
        follow: Flight | None = None,
        plan: CachePlan | None = None,
    ) -> None:
        self.entry = entry  # a hit: answer from this
        self.follow = follow  # an identical request is in flight here: follow it
        self.plan = plan  # a miss: go upstream, then complete()


NOTHING = Lookup()


def make_store(cfg: CacheConfig) -> CacheStore | None:
    if cfg.backend == "off":
        return None
    if cfg.backend == "memory":
        from gateway.cache.memory import MemoryStore

        return MemoryStore(cfg.max_entries, cfg.max_memory_bytes)
    from gateway.cache.redis import RedisStore

    return RedisStore(cfg)


class ResponseCache:
    def __init__(self, cfg: CacheConfig, store: CacheStore | None) -> None:
        self.cfg = cfg
        self.store = store
        self.enabled = store is not None
        #: cross-replica locks only make sense for a shared store
        self._locks = store is not None and store.name == "redis"
        self.flights = Flights()
        self.stats = CacheStats()
        self._ttl = cfg.ttl_s
        self._flight_wait = cfg.flight_wait_ms / 1000
        self._mode = cfg.mode
        self._namespace = cfg.namespace
        self._global = cfg.scope == "global"
        self._max_entry_bytes = cfg.max_entry_bytes
        #: key -> the bytes last decoded for it and their entry: a hit whose store hands back
        #: the same bytes (the very object, from the memory store; equal ones, from Redis)
        #: reuses that entry, with the compressed forms earlier hits made of it
        self._decoded: dict[str, tuple[bytes, Entry]] = {}

    def _bypass(self, ctx: RequestContext, error: bool = False) -> Lookup:
        ctx.cache.result = "bypass"
        self.stats.bypass += 1
        if error:
            self.stats.error += 1
            ctx.cache.error = True
        ctx.response_headers.append((b"x-gateway-cache", b"BYPASS"))
        return NOTHING

    async def lookup(self, ctx: RequestContext, call: Call) -> Lookup:
        """The router hop's cache step (timed on the Timeline as the ``cache lookup`` span)."""
        store = self.store
        if store is None:
            return NOTHING
        payload = call.payload
        if not is_cacheable(call.operation, payload, self._mode, call.path):
            return self._bypass(ctx)
        directives = parse_cache_control(ctx.cache_control) if ctx.cache_control else NO_DIRECTIVES
        if directives.no_store:
            return self._bypass(ctx)
        key = cache_key(
            namespace=self._namespace,
            path=ctx.path,
            query=ctx.query,
            payload=payload,
            scope=None if self._global else credential_scope(ctx.tenant, ctx.credential),
            headers=ctx.forwarded_org,
            body=call.body,
        )
        outcome = ctx.cache
        outcome.lookup_start = time.perf_counter()
        try:
            token: str | None = None
            other_leader = False
            if not directives.no_cache:
                flight = self.flights.get(key)
                if flight is not None:
                    outcome.key = key
                    return Lookup(follow=flight)
                try:
                    if self._locks:  # one round trip: the entry, or else the replicas' lock
                        raw, token = await store.get_or_lock(key, self._flight_wait)
                        other_leader = raw is None and token is None
                    else:
                        raw = await store.get(key)
                except CacheUnavailable:
                    return self._bypass(ctx, error=True)
                entry = self._decode(key, raw) if raw is not None else None
                if entry is not None and (
                    directives.max_age is None
                    or time.time() - entry.stored_at <= directives.max_age
                ):
                    return self._hit(ctx, entry)
            if other_leader:  # another replica is asking the upstream: wait for its entry
                entry = await self._from_other_replica(key)
                if entry is not None:
                    return self._hit(ctx, entry)
            plan = self._miss(ctx, call, key)
            plan.lock_token = token
            return Lookup(plan=plan)
        finally:
            outcome.lookup_end = time.perf_counter()

    def _decode(self, key: str, raw: bytes) -> Entry | None:
        known = self._decoded.get(key)
        if known is not None and (known[0] is raw or known[0] == raw):
            return known[1]
        entry = Entry.decode(raw)
        if entry is not None and len(raw) <= _DECODED_VALUE_MAX:
            remember(self._decoded, key, (raw, entry), _DECODED_MAX)
        return entry

    def _miss(self, ctx: RequestContext, call: Call, key: str) -> CachePlan:
        self.stats.miss += 1
        ctx.cache.result = "miss"
        ctx.response_headers.append((b"x-gateway-cache", b"MISS"))
        plan = CachePlan(key)
        if self.flights.get(key) is None:
            plan.flight = self.flights.lead(key, call.stream)
        if call.stream:
            plan.collector = StreamCollector(call.operation, self._max_entry_bytes)
        return plan

    def plan_for_follower(self, ctx: RequestContext, call: Call) -> CachePlan | None:
        """The leader a request followed produced nothing to share: it goes upstream itself."""
        if ctx.cache.key is None:
            return None
        return self._miss(ctx, call, ctx.cache.key)

    def _hit(self, ctx: RequestContext, entry: Entry) -> Lookup:
        self.followed(ctx, entry)
        return Lookup(entry=entry)

    async def _from_other_replica(self, key: str) -> Entry | None:
        """Best effort (bounded by ``flight_wait_ms``): the entry the lock holder stores."""
        assert self.store is not None
        try:
            raw = await self.store.wait_for(key, self._flight_wait)
        except CacheUnavailable:
            return None
        return Entry.decode(raw) if raw is not None else None

    def followed(self, ctx: RequestContext, entry: Entry | None) -> None:
        """A follower shares the leader's answer: a hit (it makes no upstream call)."""
        self.stats.hit += 1
        ctx.cache.result = "hit"
        age = max(0, int(time.time() - entry.stored_at)) if entry is not None else 0
        ctx.response_headers.append((b"x-gateway-cache", b"HIT"))
        ctx.response_headers.append((b"age", _AGES[age] if age < _AGES_MADE else b"%d" % age))

    async def complete(
        self,
        ctx: RequestContext,
        plan: CachePlan,
        entry: Entry | None,
        error_event: bytes | None = None,
    ) -> None:
        """After the response: store a complete, valid answer; release followers and the lock."""
        outcome = ctx.cache
        try:
            limit = self._max_entry_bytes
            if entry is not None and len(entry.body) <= limit:
                assert self.store is not None
                outcome.store_start = time.perf_counter()
                try:
                    value = entry.encode()
                    if len(value) <= limit:
                        if plan.lock_token is not None:  # store and release: one round trip
                            token, plan.lock_token = plan.lock_token, None
                            await self.store.set_and_unlock(plan.key, value, self._ttl, token)
                        else:
                            await self.store.set(plan.key, value, self._ttl)
                        outcome.stored = len(value)
                except CacheUnavailable:
                    self.stats.error += 1
                    outcome.error = True
                finally:
                    outcome.store_end = time.perf_counter()
        finally:
            self._finish_flight(plan, entry, error_event)
            if plan.lock_token is not None and self.store is not None:
                # unavailable: the lock expires by itself (flight_wait_ms)
                with contextlib.suppress(CacheUnavailable):
                    await self.store.unlock(plan.key, plan.lock_token)

    def _finish_flight(
        self, plan: CachePlan, entry: Entry | None, error_event: bytes | None = None
    ) -> None:
        if plan.flight is not None:
            plan.flight.finish(entry, error_event)
            self.flights.end(plan.key, plan.flight)
            plan.flight = None

    def state(self) -> dict[str, Any]:
        if self.store is None:
            return {"backend": "off"}
        return {
            "backend": self.store.name,
            "state": self.store.state(),
            "counters": self.stats.as_dict(),
            "in_flight": len(self.flights),
        }

    async def aclose(self) -> None:
        if self.store is not None:
            await self.store.aclose()


def json_entry(ctx: RequestContext, call: Call, body: bytes) -> Entry:
    """An entry from a complete non-stream 200 answer."""
    answer = ctx.answer
    return Entry(
        time.time(), call.operation, body, None, (answer.input_tokens, answer.output_tokens)
    )


class StreamTee:
    """Fed every relayed SSE event: collects the entry, publishes to followers."""

    __slots__ = ("collector", "flight")

    def __init__(self, plan: CachePlan) -> None:
        self.collector = plan.collector
        self.flight = plan.flight

    def __call__(self, raw: bytes, data: bytes | None, obj: Any) -> None:
        if data is None:
            return  # comments and keep-alives are not part of the answer
        if data == b"[DONE]":
            if self.flight is not None:
                self.flight.publish(DONE, raw)
            return
        usage_only = isinstance(obj, dict) and obj.get("choices") == []
        if self.collector is not None:
            self.collector.add(data, obj if obj is not None else _loads(data))
        if self.flight is not None:
            self.flight.publish(USAGE_ONLY if usage_only else CONTENT, raw)


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
