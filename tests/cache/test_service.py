"""The cache service driven directly (SPEC §10): lookup, store, directives, single flight,
fail-open — with the real memory store, and a store that is always unavailable."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.cache import follow
from gateway.cache.memory import MemoryStore
from gateway.cache.replay import Entry
from gateway.cache.service import ResponseCache, json_entry
from gateway.cache.store import CacheUnavailable
from gateway.config import CacheConfig, EdgeConfig, RouteConfig
from gateway.context import Call, RequestContext
from gateway.hops.edge import RequestEdge
from gateway.routes import Route

ROUTE = Route(RouteConfig(name="all", models=("*",), backends=()), ())
CHAT = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = b'{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3}}'


def request(payload: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None):
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": headers or [],
        "client": ("127.0.0.1", 1),
    }
    ctx = RequestEdge(EdgeConfig()).accept(scope)
    call = Call(
        ctx.path, "chat", orjson.dumps(payload), payload, payload.get("stream") is True, ROUTE
    )
    ctx.call = call
    return ctx, call


def cache(**cfg: Any) -> ResponseCache:
    config = CacheConfig(**cfg)
    return ResponseCache(config, MemoryStore(config.max_entries, config.max_memory_bytes))


def header(ctx: RequestContext, name: bytes) -> bytes | None:
    return next((v for k, v in ctx.response_headers if k == name), None)


async def fill(c: ResponseCache, payload: dict[str, Any]) -> Entry:
    ctx, call = request(payload)
    lookup = await c.lookup(ctx, call)
    assert lookup.plan is not None
    ctx.answer.input_tokens = 3
    entry = json_entry(ctx, call, ANSWER)
    await c.complete(ctx, lookup.plan, entry)
    return entry


def test_miss_store_then_hit_with_age_and_tokens():
    async def main() -> None:
        c = cache()
        ctx, call = request(CHAT)
        lookup = await c.lookup(ctx, call)
        assert lookup.plan is not None and ctx.cache.result == "miss"
        assert header(ctx, b"x-gateway-cache") == b"MISS"
        ctx.answer.input_tokens = 3
        await c.complete(ctx, lookup.plan, json_entry(ctx, call, ANSWER))
        assert ctx.cache.stored is not None and ctx.cache.store_end is not None
        again, call2 = request({**CHAT, "stream": True})  # the form does not matter
        hit = await c.lookup(again, call2)
        assert hit.entry is not None and hit.entry.body == ANSWER
        assert hit.entry.tokens == (3, None)
        assert again.cache.result == "hit" and header(again, b"age") == b"0"
        assert c.stats.as_dict() == {"hit": 1, "miss": 1, "bypass": 0, "error": 0}

    asyncio.run(main())


def test_non_deterministic_requests_bypass_unless_mode_all():
    async def main() -> None:
        payload = {**CHAT, "temperature": 0.7}
        ctx, call = request(payload)
        assert (await cache().lookup(ctx, call)).plan is None
        assert ctx.cache.result == "bypass" and header(ctx, b"x-gateway-cache") == b"BYPASS"
        ctx, call = request(payload)
        assert (await cache(mode="all").lookup(ctx, call)).plan is not None

    asyncio.run(main())


def test_cache_control_no_store_no_cache_and_max_age():
    async def main() -> None:
        c = cache()
        await fill(c, CHAT)
        ctx, call = request(CHAT, [(b"cache-control", b"no-store")])
        assert (await c.lookup(ctx, call)).plan is None and ctx.cache.result == "bypass"
        ctx, call = request(CHAT, [(b"cache-control", b"no-cache")])
        lookup = await c.lookup(ctx, call)
        assert lookup.entry is None and lookup.plan is not None  # skips the lookup, stores
        await c.complete(ctx, lookup.plan, None)
        await asyncio.sleep(0.02)
        ctx, call = request(CHAT, [(b"cache-control", b"max-age=0")])
        stale = await c.lookup(ctx, call)
        assert stale.entry is None and stale.plan is not None  # older than 0 s: a miss
        await c.complete(ctx, stale.plan, None)
        ctx, call = request(CHAT, [(b"cache-control", b"max-age=60")])
        assert (await c.lookup(ctx, call)).entry is not None

    asyncio.run(main())


def test_tenants_never_share_an_entry():
    async def main() -> None:
        c = cache()
        ctx, call = request(CHAT, [(b"authorization", b"Bearer sk-a")])
        lookup = await c.lookup(ctx, call)
        assert lookup.plan is not None
        await c.complete(ctx, lookup.plan, json_entry(ctx, call, ANSWER))
        other, call2 = request(CHAT, [(b"authorization", b"Bearer sk-b")])
        assert (await c.lookup(other, call2)).entry is None
        same, call3 = request(CHAT, [(b"authorization", b"Bearer sk-a")])
        assert (await c.lookup(same, call3)).entry is not None
        shared = cache(scope="global")
        await fill(shared, CHAT)
        anyone, call4 = request(CHAT, [(b"authorization", b"Bearer sk-z")])
        assert (await shared.lookup(anyone, call4)).entry is not None

    asyncio.run(main())


def test_single_flight_followers_get_the_leaders_entry():
    async def main() -> None:
        c = cache()
        leader, call = request(CHAT)
        plan = (await c.lookup(leader, call)).plan
        assert plan is not None and plan.flight is not None
        follower, call2 = request(CHAT)
        lookup = await c.lookup(follower, call2)
        assert lookup.follow is plan.flight
        shared = asyncio.ensure_future(follow.source(c, follower, call2, lookup.follow))
        await asyncio.sleep(0)
        assert not shared.done()  # waits for the leader
        leader.answer.input_tokens = 3
        await c.complete(leader, plan, json_entry(leader, call, ANSWER))
        got = await shared
        assert isinstance(got, Entry) and got.body == ANSWER
        assert follower.cache.result == "hit" and len(c.flights) == 0

    asyncio.run(main())


def test_a_failed_leader_sends_followers_upstream_themselves():
    async def main() -> None:
        c = cache()
        leader, call = request(CHAT)
        plan = (await c.lookup(leader, call)).plan
        follower, call2 = request(CHAT)
        flight = (await c.lookup(follower, call2)).follow
        assert plan is not None and flight is not None
        shared = asyncio.ensure_future(follow.source(c, follower, call2, flight))
        await c.complete(leader, plan, None)  # an error: nothing stored
        assert await shared is None
        assert c.plan_for_follower(follower, call2) is not None

    asyncio.run(main())


class DeadStore(MemoryStore):
    async def get(self, key: str) -> bytes | None:
        raise CacheUnavailable("down")

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        raise CacheUnavailable("down")


def test_an_unavailable_store_is_a_bypass_never_an_error():
    async def main() -> None:
        c = ResponseCache(CacheConfig(), DeadStore(10, 10_000))
        ctx, call = request(CHAT)
        assert (await c.lookup(ctx, call)).plan is None
        assert ctx.cache.result == "bypass" and ctx.cache.error
        assert c.stats.error == 1 and c.stats.bypass == 1

    asyncio.run(main())


def test_entries_over_max_entry_bytes_are_not_stored():
    async def main() -> None:
        c = cache(max_entry_bytes=64)
        ctx, call = request(CHAT)
        plan = (await c.lookup(ctx, call)).plan
        assert plan is not None
        await c.complete(ctx, plan, json_entry(ctx, call, b"x" * 100))
        again, call2 = request(CHAT)
        assert (await c.lookup(again, call2)).entry is None and ctx.cache.stored is None

    asyncio.run(main())


def test_hits_reuse_the_entry_decoded_from_the_same_bytes_and_no_other():
    async def main() -> None:
        c = cache()
        assert c.store is not None
        ctx, call = request(CHAT)
        plan = (await c.lookup(ctx, call)).plan
        assert plan is not None
        await c.complete(ctx, plan, json_entry(ctx, call, ANSWER))
        one = (await c.lookup(*request(CHAT))).entry
        two = (await c.lookup(*request(CHAT))).entry
        assert one is not None and one is two and one.body == ANSWER
        # equal bytes in a new object (as Redis hands back): still the entry decoded before
        raw = await c.store.get(plan.key)
        assert raw is not None
        await c.store.set(plan.key, bytes(bytearray(raw)), 60)
        assert (await c.lookup(*request(CHAT))).entry is one
        # other bytes under the key: decoded anew
        other = Entry(1.0, "chat", b'{"other":1}', None)
        await c.store.set(plan.key, other.encode(), 60)
        three = (await c.lookup(*request(CHAT))).entry
        assert three is not None and three is not one and three.body == b'{"other":1}'
        # another tenant's identical request never sees that entry
        foreign, call2 = request(CHAT, [(b"authorization", b"Bearer sk-other")])
        assert (await c.lookup(foreign, call2)).entry is None

    asyncio.run(main())
