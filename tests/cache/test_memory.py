"""The in-process store: LRU bounds, TTL, and single-flight locks."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from gateway.cache.memory import MemoryStore
from gateway.cache.store import CacheStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(max_entries: int = 100, max_bytes: int = 10_000) -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock()
    return MemoryStore(max_entries, max_bytes, clock=clock), clock


def test_is_a_cache_store() -> None:
    s: CacheStore = MemoryStore(10, 100)  # the Protocol type-checks
    assert s.name == "memory" and s.state() == "ok"


def test_get_set_bytes() -> None:
    async def main() -> None:
        s, _ = store()
        assert await s.get("k") is None
        await s.set("k", b"\x00\xffvalue", 60)
        assert await s.get("k") == b"\x00\xffvalue"
        await s.set("k", b"", 60)
        assert await s.get("k") == b""  # an empty entry is not a miss
        await s.aclose()
        assert await s.get("k") is None

    asyncio.run(main())


def test_ttl_honoured_on_read() -> None:
    async def main() -> None:
        s, clock = store()
        await s.set("k", b"v", 10)
        clock.now += 9.99
        assert await s.get("k") == b"v"
        clock.now += 0.01
        assert await s.get("k") is None
        assert len(s) == 0 and s.bytes_used == 0
        await s.set("z", b"v", 0)  # no lifetime: not stored
        assert await s.get("z") is None

    asyncio.run(main())


def test_lru_evicts_least_recently_used() -> None:
    async def main() -> None:
        s, _ = store(max_entries=3)
        for k in "abc":
            await s.set(k, k.encode(), 60)
        assert await s.get("a") == b"a"  # a is now the most recent
        await s.set("d", b"d", 60)
        assert await s.get("b") is None
        assert [await s.get(k) for k in "acd"] == [b"a", b"c", b"d"]
        assert len(s) == 3

    asyncio.run(main())


def test_byte_bound() -> None:
    async def main() -> None:
        s, _ = store(max_bytes=10)
        await s.set("a", b"1234", 60)
        await s.set("b", b"1234", 60)
        assert s.bytes_used == 8
        await s.set("c", b"1234", 60)  # 12 > 10: the oldest goes
        assert await s.get("a") is None and s.bytes_used == 8
        await s.set("b", b"12", 60)  # replacing accounts for the old value
        assert s.bytes_used == 6
        await s.set("big", b"x" * 11, 60)  # larger than the whole budget: never stored
        assert await s.get("big") is None
        assert await s.get("b") == b"12" and await s.get("c") == b"1234"
        await s.set("c", b"x" * 11, 60)  # an oversize replacement drops the old entry too
        assert await s.get("c") is None and s.bytes_used == 2

    asyncio.run(main())


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.binary(max_size=12), st.booleans()),
        max_size=80,
    )
)
def test_bounds_hold_for_any_sequence(ops: list[tuple[str, bytes, bool]]) -> None:
    async def main() -> None:
        s, clock = store(max_entries=4, max_bytes=20)
        last: dict[str, bytes] = {}
        for key, value, is_set in ops:
            if is_set:
                await s.set(key, value, 5)
                last[key] = value
            else:
                got = await s.get(key)
                assert got is None or got == last[key]  # never a stale or foreign value
            clock.now += 0.5
            assert len(s) <= 4 and s.bytes_used <= 20
            assert s.bytes_used == sum(len(v) for v, _ in s._entries.values())

    asyncio.run(main())


# ---------------------------------------------------------------- single flight


def test_lock_semantics() -> None:
    async def main() -> None:
        s, clock = store()
        token = await s.try_lock("k", 5)
        assert token is not None
        assert await s.try_lock("k", 5) is None
        await s.unlock("k", "not-the-token")  # does nothing
        assert await s.try_lock("k", 5) is None
        await s.unlock("k", token)
        second = await s.try_lock("k", 5)
        assert second is not None and second != token
        await s.unlock("k", token)  # a stale token cannot release the new holder
        assert await s.try_lock("k", 5) is None
        clock.now += 5  # the holder died: the lock expires
        assert await s.try_lock("k", 5) is not None

    asyncio.run(main())


def test_wait_for_returns_the_entry_once_set() -> None:
    async def main() -> None:
        s = MemoryStore(100, 10_000)
        token = await s.try_lock("k", 10)
        assert token is not None
        follower = asyncio.create_task(s.wait_for("k", 10))
        await asyncio.sleep(0.05)
        assert not follower.done()
        await s.set("k", b"answer", 60)
        await s.unlock("k", token)
        assert await asyncio.wait_for(follower, 1) == b"answer"

    asyncio.run(main())


def test_wait_for_wakes_on_set_before_unlock() -> None:
    async def main() -> None:
        s = MemoryStore(100, 10_000)
        assert await s.try_lock("k", 10)
        followers = [asyncio.create_task(s.wait_for("k", 10)) for _ in range(3)]
        await asyncio.sleep(0.01)
        await s.set("k", b"answer", 60)  # the leader has not unlocked yet
        assert await asyncio.wait_for(asyncio.gather(*followers), 1) == [b"answer"] * 3

    asyncio.run(main())


def test_wait_for_none_when_unlocked_without_entry() -> None:
    async def main() -> None:
        s = MemoryStore(100, 10_000)
        token = await s.try_lock("k", 10)
        assert token is not None
        follower = asyncio.create_task(s.wait_for("k", 10))
        await asyncio.sleep(0.01)
        await s.unlock("k", token)  # the leader's upstream call failed: nothing stored
        assert await asyncio.wait_for(follower, 1) is None
        assert await s.wait_for("other", 10) is None  # no lock, no entry: nothing to wait for

    asyncio.run(main())


def test_wait_for_honours_timeout() -> None:
    async def main() -> None:
        s = MemoryStore(100, 10_000)
        assert await s.try_lock("k", 60)
        started = time.monotonic()
        assert await s.wait_for("k", 0.2) is None
        assert 0.2 <= time.monotonic() - started < 0.2 + 0.5

    asyncio.run(main())


def test_wait_for_gives_up_when_the_lock_expires() -> None:
    async def main() -> None:
        s = MemoryStore(100, 10_000)
        assert await s.try_lock("k", 0.1)  # a leader that never reports back
        started = time.monotonic()
        assert await s.wait_for("k", 10) is None
        assert time.monotonic() - started < 0.1 + 0.5
        assert await s.try_lock("k", 1) is not None

    asyncio.run(main())


def test_get_or_lock_and_set_and_unlock() -> None:
    from tests.cache.test_redis import check_one_round_trip_flight

    async def main() -> None:
        store = MemoryStore(100, 1_000_000)
        await check_one_round_trip_flight(store, store, "k")

    asyncio.run(main())
