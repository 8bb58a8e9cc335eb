"""The base a store kept in Redis is built on (gateway/store/): the prefixed key-value map and its
in-memory twin answering alike against a real ``redis-server``, a store's own error type from the
guard when Redis is gone, and the one reading of which Redis the config names."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store.connect import SharedRedis, shared_redis
from gateway.store.guard import RedisUnavailable
from gateway.store.keyvalue import KeyValue, MemoryKV, RedisKV
from tests.redis_support import RedisServer, free_port
from tests.support import gateway_config

ROUTED = """
[[backends]]
name = "a"
url = "http://a.invalid/v1"
[[routes]]
models = ["*"]
backends = ["a"]
"""


class KeysUnavailable(RedisUnavailable):
    """The error type of a store made for this test."""


class KeyStore(RedisKV):
    """A new store on the base: its prefix, its error type, its name in log lines."""

    error = KeysUnavailable
    what = "test keys"


async def _exercise(kv: KeyValue) -> list[object]:
    seen: list[object] = [await kv.get("a")]
    await kv.set("a", "1", 60)
    await kv.set("b", "zwei ü", 60)
    seen += [await kv.get("a"), await kv.get("b")]
    await kv.set("a", "2", 60)  # replaced
    seen.append(await kv.get("a"))
    seen += [await kv.claim("c", 60), await kv.claim("c", 60), await kv.claim("a", 60)]
    await kv.delete("a")
    seen += [await kv.get("a"), await kv.get("c"), kv.state()]
    return seen


def test_the_redis_map_and_its_in_memory_twin_answer_alike(redis: RedisServer):
    async def main() -> tuple[list[object], list[object], object, object]:
        shared = KeyStore("test:kv:one:", redis.url, 0.5)
        other = KeyStore("test:kv:two:", redis.url, 0.5)
        try:
            in_redis = await _exercise(shared)
            elsewhere = await other.get("b")  # another prefix is another map
            await other.set("b", "x", 60)
            return in_redis, await _exercise(MemoryKV(100)), elsewhere, await shared.get("b")
        finally:
            await shared.aclose()
            await other.aclose()

    in_redis, in_memory, elsewhere, kept = asyncio.run(main())
    assert (
        in_redis
        == in_memory
        == [None, "1", "zwei ü", "2", True, False, False, None, "claimed", "ok"]
    )
    assert (elsewhere, kept) == (None, "zwei ü")
    ttl = int(redis.command(b"TTL test:kv:one:b")[1:])
    assert 50 <= ttl <= 60


def test_a_dead_redis_raises_the_store_s_own_error_and_the_breaker_opens():
    port = free_port()  # nothing listens there

    async def main() -> list[tuple[type[BaseException], bool, str]]:
        store = KeyStore("test:kv:", f"redis://127.0.0.1:{port}/0", 0.2)
        seen = []
        try:
            for _ in range(4):
                with pytest.raises(KeysUnavailable) as info:
                    await store.get("a")
                seen.append((info.type, info.value.maybe_ran, store.state()))
        finally:
            await store.aclose()
        return seen

    seen = asyncio.run(main())
    # three refused connections open the breaker; then nothing is sent (maybe_ran False)
    assert [s[2] for s in seen] == ["ok", "ok", "open", "open"]
    assert [s[1] for s in seen] == [True, True, True, False]


def test_the_config_names_one_redis_for_every_shared_store():
    def named(toml: str, **env: str) -> SharedRedis | None:
        return shared_redis(gateway_config(ROUTED + toml), env)

    assert named("") is None
    assert named('[cache]\nbackend = "memory"') is None
    limits = named('[auth]\nredis_url = "redis://10.0.0.1:6379/0"\ntimeout_ms = 80')
    assert limits == SharedRedis("redis://10.0.0.1:6379/0", None, False, 80.0)
    cache = """
[cache]
backend = "redis"
url = "redis://10.0.0.2:6379/0"
cluster = true
password_env = "CACHE_PW"
timeout_ms = 30
"""
    assert named(cache, CACHE_PW="s3") == SharedRedis("redis://10.0.0.2:6379/0", "s3", True, 30.0)
    both = cache + '[auth]\nredis_url = "redis://10.0.0.1:6379/0"\n'
    assert named(both, CACHE_PW="s3") == SharedRedis("redis://10.0.0.1:6379/0", None, False, 50.0)
