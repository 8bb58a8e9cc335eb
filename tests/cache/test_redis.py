"""RedisStore against real redis-server processes: data, locks, and every way Redis fails.

Each fault test starts its own server (never the shared one on 6379) and kills, pauses
(SIGSTOP: black-holed, connections accepted but never answered) or restarts it by its PID.
Time bounds here are fault bounds -- how long one failing call may block a request -- not
speed benchmarks: the configured timeout plus a generous slack.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import pytest

from gateway.cache.redis import RedisStore
from gateway.cache.store import CacheStore, CacheUnavailable, lock_key
from gateway.config import CacheConfig
from gateway.store.cluster import ClusterClient, key_slot
from gateway.store.connect import connect
from tests.redis_support import RedisCluster, RedisServer

TIMEOUT_MS = 300.0
SLACK_S = 0.5
RESET_S = 0.5
#: how long one failing call may block: the configured timeout plus slack
BOUND_S = TIMEOUT_MS / 1000 + SLACK_S


def config(url: str, **overrides: Any) -> CacheConfig:
    cfg = CacheConfig(
        backend="redis",
        url=url,
        timeout_ms=TIMEOUT_MS,
        breaker_failures=3,
        breaker_reset_s=RESET_S,
    )
    return dataclasses.replace(cfg, **overrides)


@contextlib.asynccontextmanager
async def open_store(cfg: CacheConfig, **kwargs: Any) -> AsyncIterator[RedisStore]:
    store = RedisStore(cfg, **kwargs)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


async def failing(call: Awaitable[Any]) -> tuple[CacheUnavailable, float]:
    """Await ``call``, which must raise CacheUnavailable; return it and how long it blocked."""
    started = time.monotonic()
    with pytest.raises(CacheUnavailable) as info:
        await call
    return info.value, time.monotonic() - started


def breaker_refused(exc: CacheUnavailable) -> bool:
    return "breaker" in str(exc) and exc.__cause__ is None


# ---------------------------------------------------------------- data


def test_is_a_cache_store(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url)) as store:
            s: CacheStore = store
            assert s.name == "redis" and s.state() == "ok"

    asyncio.run(main())


def test_get_set_bytes_round_trip(server: RedisServer) -> None:
    values = [b"", b"\x00\xff\r\n$-1\r\n", bytes(range(256)), b"x" * (1024 * 1024)]

    async def main() -> None:
        async with open_store(config(server.url)) as store:
            assert await store.get("missing") is None
            for i, value in enumerate(values):
                await store.set(f"k{i}", value, 60)
            for i, value in enumerate(values):
                got = await store.get(f"k{i}")
                assert type(got) is bytes and got == value
            await store.set("k0", b"replaced", 60)
            assert await store.get("k0") == b"replaced"

    asyncio.run(main())


def test_ttl_sets_px_and_expires(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url)) as store:
            await store.set("short", b"v", 1.0)
            await store.set("long", b"v", 600)
            pttl = int(server.command(b"PTTL short")[1:])
            assert 0 < pttl <= 1000
            assert 590_000 < int(server.command(b"PTTL long")[1:]) <= 600_000
            assert await store.get("short") == b"v"
            await asyncio.sleep(1.1)
            assert await store.get("short") is None
            assert await store.get("long") == b"v"

    asyncio.run(main())


# ---------------------------------------------------------------- locks


def test_lock_semantics(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url)) as a, open_store(config(server.url)) as b:
            token = await a.try_lock("k", 5)
            assert token
            assert await b.try_lock("k", 5) is None  # another replica
            assert await a.try_lock("k", 5) is None  # or the same one
            await b.unlock("k", "wrong-token")
            assert server.command(b"GET " + lock_key("k").encode()) == token.encode()
            await a.unlock("k", token)
            assert server.command(b"EXISTS " + lock_key("k").encode()) == b":0"
            second = await b.try_lock("k", 1.0)
            assert second and second != token
            await a.unlock("k", token)  # a stale token cannot release the new holder
            assert await a.try_lock("k", 5) is None
            await asyncio.sleep(1.1)  # the holder died: the lock expires
            assert await a.try_lock("k", 5) is not None

    asyncio.run(main())


def check_one_round_trip_flight(a: CacheStore, b: CacheStore, key: str) -> Awaitable[None]:
    async def run() -> None:
        value, token = await a.get_or_lock(key, 5)
        assert value is None and token  # a miss takes the lock
        assert await b.get_or_lock(key, 5) == (None, None)  # a miss while another leads
        assert await b.try_lock(key, 5) is None
        await b.set_and_unlock(key, b"stale", 60, "wrong-token")  # stores, but cannot unlock
        assert await b.try_lock(key, 5) is None
        await a.set_and_unlock(key, b"answer", 60, token)
        assert await b.get_or_lock(key, 5) == (b"answer", None)  # a hit takes no lock
        assert await b.get(key) == b"answer"
        relock = await b.try_lock(key, 5)  # a's lock is gone, and the hit left none behind
        assert relock
        await b.unlock(key, relock)

    return run()


def test_get_or_lock_and_set_and_unlock(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url)) as a, open_store(config(server.url)) as b:
            await check_one_round_trip_flight(a, b, "gateway:cache:v1:default:{abc}")

    asyncio.run(main())


def test_wait_for_returns_the_entry_once_set(server: RedisServer) -> None:
    async def main() -> None:
        async with (
            open_store(config(server.url)) as leader,
            open_store(config(server.url)) as replica,
        ):
            token = await leader.try_lock("k", 10)
            assert token
            follower = asyncio.create_task(replica.wait_for("k", 10))
            await asyncio.sleep(0.1)
            assert not follower.done()
            await leader.set("k", b"answer", 60)
            await leader.unlock("k", token)
            assert await asyncio.wait_for(follower, 5) == b"answer"

    asyncio.run(main())


def test_wait_for_none_when_unlocked_without_entry(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url)) as store:
            token = await store.try_lock("k", 10)
            assert token
            follower = asyncio.create_task(store.wait_for("k", 10))
            await asyncio.sleep(0.1)
            assert not follower.done()
            await store.unlock("k", token)
            assert await asyncio.wait_for(follower, 5) is None
            assert await store.wait_for("nobody-holds-this", 10) is None

    asyncio.run(main())


def test_wait_for_honours_timeout(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url)) as store:
            assert await store.try_lock("k", 60)
            started = time.monotonic()
            assert await store.wait_for("k", 0.3) is None
            assert 0.3 <= time.monotonic() - started < 0.3 + SLACK_S
            assert store.state() == "ok"  # giving up on a wait is not a Redis failure

    asyncio.run(main())


# ---------------------------------------------------------------- Redis killed


class Listener:
    """A plain socket listening on a port, to see whether anyone connects to it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.setblocking(False)

    def accepted(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


def test_killed_fails_fast_then_breaker_skips_network_then_resumes(
    server: RedisServer,
) -> None:
    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=3)) as store:
            await store.set("k", b"v", 60)
            assert await store.get("k") == b"v"
            server.kill()
            for call in (store.get("k"), store.set("k", b"v", 60), store.try_lock("k", 1)):
                exc, blocked = await failing(call)
                assert not breaker_refused(exc) and blocked < BOUND_S
            assert store.state() == "open"

            # open: no connection attempt at all, even though something listens now
            listener = Listener(server.port)
            try:
                for _ in range(20):
                    exc, _ = await failing(store.get("k"))
                    assert breaker_refused(exc)
                exc, _ = await failing(store.wait_for("k", 1))
                assert breaker_refused(exc)
                assert listener.accepted() == 0
            finally:
                listener.close()

            server.start()  # same port, no gateway restart
            await asyncio.sleep(RESET_S)
            assert store.state() == "half_open"
            assert await store.get("k") is None  # the probe succeeds (the data died with it)
            assert store.state() == "ok"
            await store.set("k", b"again", 60)
            assert await store.get("k") == b"again"

    asyncio.run(main())


def test_killed_and_restarted_reconnects_by_itself(server: RedisServer) -> None:
    """Pooled connections to the old process are dead; redis-py replaces them."""

    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=100)) as store:
            # several pooled connections, all idle when the server dies
            await asyncio.gather(*(store.set(f"k{i}", b"v", 60) for i in range(8)))
            server.kill()
            server.start()
            await asyncio.sleep(0.05)  # the loop sees the old sockets' EOF
            results = await asyncio.gather(
                *(store.set(f"k{i}", b"new", 60) for i in range(8)), return_exceptions=True
            )
            assert all(r is None for r in results), results
            assert await store.get("k3") == b"new"

    asyncio.run(main())


def test_restart_after_stop(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=1)) as store:
            await store.set("k", b"v", 60)
            server.stop()
            await failing(store.get("k"))
            assert store.state() == "open"
            server.restart()
            await asyncio.sleep(RESET_S)
            await store.set("k", b"v2", 60)
            assert store.state() == "ok"
            assert await store.get("k") == b"v2"

    asyncio.run(main())


# ---------------------------------------------------------------- Redis black-holed (SIGSTOP)


def test_paused_times_out_within_bound_then_breaker_then_resumes(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=3)) as store:
            await store.set("k1", b"a", 60)
            await store.set("k2", b"b", 60)
            server.pause()
            try:
                for call in (store.get("k1"), store.set("k3", b"c", 60), store.get("k2")):
                    exc, blocked = await failing(call)
                    assert not breaker_refused(exc)
                    assert TIMEOUT_MS / 1000 * 0.9 <= blocked < BOUND_S
                assert store.state() == "open"
                exc, blocked = await failing(store.get("k1"))
                assert breaker_refused(exc)

                await asyncio.sleep(RESET_S)  # half-open, still paused: the probe times out
                exc, blocked = await failing(store.get("k1"))
                assert not breaker_refused(exc) and blocked < BOUND_S
                assert store.state() == "open"
            finally:
                server.resume()
            await asyncio.sleep(RESET_S)
            assert await store.get("k2") == b"b"  # the probe; no stale reply mixed in
            assert store.state() == "ok"
            assert await store.get("k1") == b"a"

    asyncio.run(main())


def test_half_open_lets_one_probe_through(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=1)) as store:
            server.pause()
            try:
                await failing(store.get("k"))
                assert store.state() == "open"
                await asyncio.sleep(RESET_S)
                results = await asyncio.gather(
                    *(store.get("k") for _ in range(5)), return_exceptions=True
                )
                assert all(isinstance(r, CacheUnavailable) for r in results)
                refused = [r for r in results if breaker_refused(r)]  # type: ignore[arg-type]
                assert len(refused) == 4  # one probe went out, the others failed fast
            finally:
                server.resume()

    asyncio.run(main())


def test_cancelled_probe_frees_the_probe_slot(server: RedisServer) -> None:
    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=1)) as store:
            server.pause()
            try:
                await failing(store.get("k"))
                await asyncio.sleep(RESET_S)
                probe = asyncio.create_task(store.get("k"))
                await asyncio.sleep(0.02)
                probe.cancel()  # the client went away mid-probe
                with pytest.raises(asyncio.CancelledError):
                    await probe
                assert store.state() == "half_open"
                exc, _ = await failing(store.get("k"))
                assert not breaker_refused(exc)  # a new probe went out
            finally:
                server.resume()

    asyncio.run(main())


def test_no_reply_mix_up_after_pause(server: RedisServer) -> None:
    """Commands that timed out while paused get their replies after SIGCONT, on sockets the
    client must have discarded: a later command must never read an earlier one's reply."""

    async def main() -> None:
        async with open_store(config(server.url, breaker_failures=10_000)) as store:
            for i in range(8):
                await store.set(f"k{i}", b"value-%d" % i, 60)
            server.pause()
            try:
                # several pooled connections, each with a GET the server has not answered
                results = await asyncio.gather(
                    *(store.get(f"k{i}") for i in range(8)), return_exceptions=True
                )
                assert all(isinstance(r, CacheUnavailable) for r in results)
            finally:
                server.resume()
            await asyncio.sleep(0.1)  # the stale replies are written by now
            for _ in range(3):
                got = await asyncio.gather(*(store.get(f"k{7 - i}") for i in range(8)))
                assert got == [b"value-%d" % (7 - i) for i in range(8)]

    asyncio.run(main())


class HoldingProxy:
    """A TCP proxy in front of Redis that can stop passing replies after N more bytes."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.connections = 0
        self.budget: int | None = None  # None: pass everything
        self.released = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def hold_after(self, n: int) -> None:
        self.budget = n
        self.released = asyncio.Event()

    def release(self) -> None:
        self.budget = None
        self.released.set()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [cwriter, swriter]
        for coro in (self._pipe(creader, swriter, False), self._pipe(sreader, cwriter, True)):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if replies and self.budget is not None:
                    passed, data = data[: self.budget], data[self.budget :]
                    self.budget -= len(passed)
                    writer.write(passed)
                    if data:
                        await self.released.wait()
                writer.write(data)
                await writer.drain()
        writer.close()

    async def close(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await self._server.wait_closed()


def test_half_read_reply_is_never_reused(server: RedisServer) -> None:
    """A reply cut off mid-way by the timeout: its tail arrives later on a socket the client
    must have discarded, never in front of the next command's reply."""

    async def main() -> None:
        proxy = HoldingProxy(server.port)
        port = await proxy.start()
        cfg = config(f"redis://127.0.0.1:{port}/0", breaker_failures=10_000)
        try:
            async with open_store(cfg, max_connections=1) as store:  # one socket, reused
                big = b"A" * 200_000
                await store.set("big", big, 60)
                await store.set("small", b"small", 60)
                assert proxy.connections == 1
                proxy.hold_after(1000)  # 1000 bytes of the next reply, then nothing
                _, blocked = await failing(store.get("big"))
                assert blocked < BOUND_S
                proxy.release()  # the rest of the big reply flows now
                await asyncio.sleep(0.05)
                assert await store.get("small") == b"small"
                assert proxy.connections == 2  # the half-read socket was thrown away
                assert await store.get("big") == big
        finally:
            await proxy.close()

    asyncio.run(main())


def test_pool_is_bounded_and_never_queues_past_the_timeout(server: RedisServer) -> None:
    async def main() -> None:
        cfg = config(server.url, breaker_failures=10_000)
        async with open_store(cfg, max_connections=2) as store:
            await store.set("k", b"v", 60)
            server.pause()
            try:
                started = time.monotonic()
                results = await asyncio.gather(
                    *(store.get("k") for _ in range(20)), return_exceptions=True
                )
                assert time.monotonic() - started < BOUND_S  # 20 calls, 2 sockets: no queue
                assert all(isinstance(r, CacheUnavailable) for r in results)
            finally:
                server.resume()
            assert await store.get("k") == b"v"

    asyncio.run(main())


# ---------------------------------------------------------------- connection options


def test_password_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with RedisServer(password="s3cret") as protected:

        async def main() -> None:
            monkeypatch.setenv("TEST_REDIS_PASSWORD", "s3cret")
            cfg = config(protected.url, password_env="TEST_REDIS_PASSWORD")
            async with open_store(cfg) as store:
                await store.set("k", b"v", 60)
                assert await store.get("k") == b"v"
            monkeypatch.setenv("TEST_REDIS_PASSWORD", "wrong")
            async with open_store(cfg) as store:
                exc, _ = await failing(store.get("k"))
                assert "s3cret" not in str(exc) and "wrong" not in str(exc)
            async with open_store(config(protected.url)) as store:  # no password at all
                await failing(store.get("k"))

        asyncio.run(main())
    monkeypatch.delenv("TEST_REDIS_PASSWORD")
    with pytest.raises(ValueError, match="TEST_REDIS_PASSWORD"):
        RedisStore(config("redis://127.0.0.1:1/0", password_env="TEST_REDIS_PASSWORD"))


def test_unix_socket() -> None:
    with RedisServer(unix_socket=True) as unix_server:

        async def main() -> None:
            async with open_store(config(unix_server.unix_url)) as store:
                await store.set("k", b"v", 60)
                assert await store.get("k") == b"v"
            assert unix_server.command(b"GET k") == b"v"

        asyncio.run(main())


def test_unreachable_at_startup_is_not_an_error() -> None:
    """Constructing the store never connects: a gateway starts while Redis is down."""

    async def main() -> None:
        port = socket.socket()
        port.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{port.getsockname()[1]}/0"
        port.close()
        async with open_store(config(url)) as store:
            _, blocked = await failing(store.get("k"))
            assert blocked < BOUND_S

    asyncio.run(main())


# ---------------------------------------------------------------- Redis Cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(nodes=3) as c:
        yield c


def test_cluster_set_get_across_slots(cluster: RedisCluster) -> None:
    for node in cluster.servers:
        assert node.command(b"CONFIG RESETSTAT") == b"+OK"

    async def main() -> None:
        async with open_store(config(cluster.url, cluster=True)) as store:
            keys = [f"gateway:cache:v1:default:{i:064x}" for i in range(30)]
            for i, k in enumerate(keys):
                await store.set(k, b"v%d" % i, 60)
            assert [await store.get(k) for k in keys] == [b"v%d" % i for i in range(30)]
            per_node = [int(s.command(b"DBSIZE")[1:]) for s in cluster.servers]
            assert all(n > 0 for n in per_node), per_node  # the keys really are spread out
            assert await store.get("gateway:cache:v1:default:missing") is None

    asyncio.run(main())
    # redis-py's RedisCluster would load the COMMAND table (~35 ms of event-loop CPU) on every
    # topology refresh; gateway/store/cluster.py routes the keys without it
    for node in cluster.servers:
        assert b"cmdstat_command:" not in node.command(b"INFO commandstats")


def test_cluster_locks(cluster: RedisCluster) -> None:
    async def main() -> None:
        cfg = config(cluster.url, cluster=True)
        async with open_store(cfg) as a, open_store(cfg) as b:
            for i in range(6):  # lock keys on several nodes
                k = f"gateway:cache:v1:default:lock-test-{i}"
                token = await a.try_lock(k, 5)
                assert token
                assert await b.try_lock(k, 5) is None
                await b.unlock(k, "wrong")
                assert await b.try_lock(k, 5) is None
                follower = asyncio.create_task(b.wait_for(k, 5))
                await asyncio.sleep(0.02)
                await a.set(k, b"answer", 60)
                await a.unlock(k, token)
                assert await asyncio.wait_for(follower, 5) == b"answer"
                assert await b.try_lock(k, 5) is not None
            for i in range(6):  # the one-round-trip scripts, on keys of several slots
                await check_one_round_trip_flight(a, b, f"gateway:cache:v1:default:{{k{i}}}")

    asyncio.run(main())


def test_cluster_node_paused_fails_its_slots_within_bound(cluster: RedisCluster) -> None:
    async def main() -> None:
        cfg = config(cluster.url, cluster=True, breaker_failures=10_000)
        async with open_store(cfg) as store:
            keys = [f"gateway:cache:v1:default:pause-{i}" for i in range(12)]
            for k in keys:
                await store.set(k, b"v", 60)
            cluster.servers[1].pause()
            failed = 0
            try:
                for k in keys:
                    started = time.monotonic()
                    try:
                        assert await store.get(k) == b"v"
                    except CacheUnavailable:
                        failed += 1
                    assert time.monotonic() - started < BOUND_S
            finally:
                cluster.servers[1].resume()
            assert 0 < failed < len(keys)  # only the paused node's slots fail
            await asyncio.sleep(0.1)
            assert [await store.get(k) for k in keys] == [b"v"] * len(keys)

    asyncio.run(main())


def test_cluster_key_slots_are_redis_clusters() -> None:
    """The client's own slot function (CRC16/XMODEM, hash tags) against redis-py's."""
    from redis.crc import key_slot as redis_key_slot

    keys = ["", "a", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "{}x"]
    keys += [f"gateway:cache:v1:default:{i:064x}" for i in range(200)]
    for key in keys:
        assert key_slot(key) == redis_key_slot(key.encode()), key
        assert key_slot(key.encode()) == key_slot(key)


def test_cluster_scripts_fall_back_to_eval_after_a_script_flush(cluster: RedisCluster) -> None:
    async def main() -> None:
        client = connect(cluster.url, 1.0, cluster=True)
        try:
            script = client.register_script("return redis.call('INCR', KEYS[1]) + ARGV[1]")
            keys = [f"gateway:test:script:{i}" for i in range(12)]  # several slots and nodes
            assert [await script([k], [10]) for k in keys] == [11] * len(keys)
            for node in cluster.servers:
                assert node.command(b"SCRIPT FLUSH") == b"+OK"
            assert [await script([k], [10]) for k in keys] == [12] * len(keys)  # EVAL again
        finally:
            await client.aclose()

    asyncio.run(main())


def _owner(cluster: RedisCluster, key: str) -> int:
    """The index of the node that serves ``key`` (the others answer MOVED)."""
    owners = [
        i
        for i, node in enumerate(cluster.servers)
        if not node.command(f"EXISTS {key}".encode()).startswith(b"-MOVED")
    ]
    assert len(owners) == 1, owners
    return owners[0]


def test_cluster_follows_ask_then_moved_while_a_slot_migrates(cluster: RedisCluster) -> None:
    """A slot migrating from one node to another: a key the source no longer has is answered
    ASK (the client sends ASKING and the command to the target); once the slot has moved, the
    source answers MOVED (the client follows it and reloads its slot map)."""
    key = "gateway:test:{migrating}"
    src = _owner(cluster, key)
    dst = (src + 1) % len(cluster.servers)
    slot = key_slot(key)
    ids = [node.command(b"CLUSTER MYID").decode() for node in cluster.servers]
    source, target = cluster.servers[src], cluster.servers[dst]

    async def main() -> None:
        client = connect(cluster.url, 1.0, cluster=True)
        assert isinstance(client, ClusterClient)
        try:
            assert await client.get(key) is None  # the slot map is loaded
            assert target.command(f"CLUSTER SETSLOT {slot} IMPORTING {ids[src]}".encode()) == b"+OK"
            assert source.command(f"CLUSTER SETSLOT {slot} MIGRATING {ids[dst]}".encode()) == b"+OK"
            assert await client.set(key, b"moved") is True  # ASK: stored on the target
            assert await client.get(key) == b"moved"
            assert source.command(f"EXISTS {key}".encode()).startswith(b"-ASK")  # not there
            for i in (dst, src, *(i for i in range(len(ids)) if i not in (src, dst))):
                command = f"CLUSTER SETSLOT {slot} NODE {ids[dst]}".encode()
                assert cluster.servers[i].command(command) == b"+OK"
            assert await client.get(key) == b"moved"  # MOVED, followed
            assert await client.get(key) == b"moved"  # the reloaded map: straight there
            assert _owner(cluster, key) == dst
            assert await client.delete(key) == 1
        finally:
            await client.aclose()

    asyncio.run(main())
