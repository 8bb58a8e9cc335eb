"""Response ownership on its own (gateway/hops/ownership.py): the bounded, expiring LRU
(gateway/store/keyvalue.py), the Redis store against a real ``redis-server`` (shared by two
instances, as by two replicas), and a dead or black-holed Redis costing no request more than
its bound."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from gateway.config import BackendConfig
from gateway.errors import NotFound
from gateway.hops.ownership import (
    LOCAL_MAX_ENTRIES,
    MAX_ID_CHARS,
    Ownership,
    RedisOwners,
    build_ownership,
    response_path_id,
)
from gateway.hops.references import Named, find, rule_for
from gateway.routes import Backend
from gateway.store.keyvalue import MemoryKV
from tests.redis_support import RedisServer, free_port
from tests.support import gateway_config

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def backends(*names: str) -> dict[str, Backend]:
    return {n: Backend(BackendConfig(n, f"http://{n}.invalid/v1"), None, {}) for n in names}


def test_entries_expire_after_their_ttl():
    clock = Clock()
    owners = MemoryKV(LOCAL_MAX_ENTRIES, clock=clock)
    owners.set_now("resp_1", "a", 10.0)
    owners.set_now("resp_2", "b", 100.0)
    clock.t += 9.9
    assert owners.get_now("resp_1") == "a"
    clock.t += 0.2
    assert owners.get_now("resp_1") is None and len(owners) == 1  # dropped when found expired
    assert owners.get_now("resp_2") == "b"


def test_the_least_recently_used_entry_goes_first_beyond_the_bound():
    owners = MemoryKV(max_entries=3)
    for i in range(3):
        owners.set_now(f"resp_{i}", "a", 60.0)
    assert owners.get_now("resp_0") == "a"  # used: now the most recent
    owners.set_now("resp_3", "b", 60.0)
    assert len(owners) == 3
    assert owners.get_now("resp_1") is None  # the least recently used went
    assert [owners.get_now(f"resp_{i}") for i in (0, 2, 3)] == ["a", "a", "b"]
    owners.delete_now("resp_0")
    assert owners.get_now("resp_0") is None


def test_lookups_name_configured_backends_only_and_ignore_unusable_ids():
    known = backends("a", "b")
    ownership = Ownership(known)
    run(ownership.record("resp_1", known["b"], 60.0))
    assert run(ownership.owner("resp_1")) is known["b"]
    assert run(ownership.owner("resp_2")) is None
    ownership.local.set_now("resp_3", "gone", 60.0)  # a backend the config no longer has
    assert run(ownership.owner("resp_3")) is None
    for bad in (None, 42, "", "r" * (MAX_ID_CHARS + 1)):
        assert run(ownership.owner(bad)) is None
    run(ownership.record("r" * (MAX_ID_CHARS + 1), known["a"], 60.0))
    assert len(ownership.local) == 2  # resp_1 and resp_3: the long id was not kept
    run(ownership.forget("resp_1"))
    assert run(ownership.owner("resp_1")) is None


RESPONSES = rule_for("/v1/responses")
assert RESPONSES is not None


def test_entries_are_bound_to_their_tenant():
    """docs/spec.md §24: another tenant's id is a 404, as if it did not exist."""
    known = backends("a", "b")
    ownership = Ownership(known)
    run(ownership.record("file-1", known["a"], 60.0, "t1"))
    run(ownership.record("resp_open", known["b"], 60.0))  # made with auth off
    assert run(ownership.lookup("file-1")) == ("a", "t1")
    assert run(ownership.owner("file-1", "t1")) is known["a"]
    assert run(ownership.required("file-1", "t1")) is known["a"]
    for call in (ownership.owner("file-1", "t2"), ownership.required("file-1", "t2")):
        with pytest.raises(NotFound):
            run(call)
    with pytest.raises(NotFound):
        run(ownership.owner("file-1"))  # no tenant is not the same as t1
    with pytest.raises(NotFound):
        run(ownership.owner("resp_open", "t1"))
    assert run(ownership.owner("resp_open")) is known["b"]
    # an id nobody is known to own: 404 with auth on, the route rule's with auth off
    with pytest.raises(NotFound):
        run(ownership.required("file-unknown", "t1"))
    assert run(ownership.required("file-unknown", None)) is None
    # a Responses request follows its conversation, else its previous response
    run(ownership.record("conv_1", known["b"], 60.0, "t1"))

    def follows(payload: dict[str, Any], tenant: str | None) -> Backend | None:
        named = find(RESPONSES, None, payload) or Named()
        return run(ownership.place(named, tenant))

    assert follows({"conversation": {"id": "conv_1"}}, "t1") is known["b"]
    assert follows({"conversation": "conv_1", "previous_response_id": "file-1"}, "t1") is known["b"]
    assert follows({"previous_response_id": "file-1"}, "t1") is known["a"]
    assert follows({"input": "hi"}, "t1") is None
    assert follows({"previous_response_id": "resp_x"}, None) is None  # auth off: by model
    for foreign in ({"previous_response_id": "resp_x"}, {"conversation": "conv_1"}):
        with pytest.raises(NotFound):  # unknown with auth on; another tenant's
            follows(foreign, "t1" if "previous_response_id" in foreign else "t2")


def test_response_paths_name_their_id():
    assert response_path_id("/v1/responses/resp_9/input_items") == "resp_9"
    assert response_path_id("/v1/responses/") is None
    assert response_path_id("/v1/responsesX/resp_9") is None


# ---------------------------------------------------------------- Redis


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_two_instances_sharing_redis_agree(redis):
    known = backends("a", "b")

    async def main() -> None:
        one = Ownership(known, RedisOwners(redis.url, 200, namespace="t1"))
        two = Ownership(known, RedisOwners(redis.url, 200, namespace="t1"))
        other = Ownership(known, RedisOwners(redis.url, 200, namespace="elsewhere"))
        try:
            await one.record("resp_shared", known["b"], 3600)
            assert await two.owner("resp_shared") is known["b"]  # from Redis: not in two's LRU
            assert len(two.local) == 0
            assert await other.owner("resp_shared") is None  # another deployment's namespace
            await two.forget("resp_shared")
            assert await two.owner("resp_shared") is None
            assert await one.owner("resp_shared") is known["b"]  # one's LRU still knows it
            assert one.state() == "redis:ok"
        finally:
            for o in (one, two, other):
                await o.aclose()

    run(main())
    assert redis.command(b"EXISTS gateway:response-owner:v1:t1:resp_shared") == b":0"


def test_the_mapping_expires_in_redis_with_the_ttl(redis):
    known = backends("a")

    async def main() -> None:
        one = Ownership(known, RedisOwners(redis.url, 200, namespace="ttl"))
        try:
            await one.record("resp_ttl", known["a"], 86400)
        finally:
            await one.aclose()

    run(main())
    ttl = int(redis.command(b"TTL gateway:response-owner:v1:ttl:resp_ttl")[1:])
    assert 86390 <= ttl <= 86400


def test_a_dead_redis_fails_nothing_and_routes_by_model():
    known = backends("a")
    port = free_port()  # nothing listens there

    async def main() -> None:
        ownership = Ownership(known, RedisOwners(f"redis://127.0.0.1:{port}/0", 200))
        try:
            await ownership.record("resp_local", known["a"], 60)  # kept locally
            assert await ownership.owner("resp_local") is known["a"]
            assert await ownership.owner("resp_elsewhere") is None
            for _ in range(3):
                await ownership.owner("resp_elsewhere")
            assert ownership.state() == "redis:open"  # the breaker stops calling it
            await ownership.forget("resp_local")
        finally:
            await ownership.aclose()

    run(main())


def test_a_black_holed_redis_is_bounded_by_its_timeout_then_not_called():
    known = backends("a")
    with RedisServer() as server:
        server.pause()  # the kernel accepts, nothing answers
        try:

            async def main() -> list[str]:
                ownership = Ownership(known, RedisOwners(server.url, 100))
                states = []
                try:
                    for _ in range(5):
                        # a lookup that waited on the paused server unbounded would hang here
                        async with asyncio.timeout(5):
                            assert await ownership.owner("resp_x") is None
                        states.append(ownership.state())
                finally:
                    await ownership.aclose()
                return states

            states = run(main())
        finally:
            server.resume()
    # three timeouts open the breaker; after that lookups do not touch the network
    assert states == ["redis:ok", "redis:ok", "redis:open", "redis:open", "redis:open"]


def test_redis_is_used_when_the_limiter_s_or_the_cache_s_is_configured():
    def kind(toml: str) -> str:
        ownership = build_ownership(
            gateway_config(
                f"""
[[backends]]
name = "a"
url = "http://a.invalid/v1"
[[routes]]
models = ["*"]
backends = ["a"]
{toml}
"""
            ),
            {},
        )
        state = ownership.state()
        run(ownership.aclose())
        return state.split(":")[0]

    assert kind("") == "memory"
    assert kind('[cache]\nbackend = "memory"') == "memory"
    assert kind('[auth]\nredis_url = "redis://127.0.0.1:1/0"') == "redis"
    assert kind('[cache]\nbackend = "redis"\nurl = "redis://127.0.0.1:1/0"') == "redis"
