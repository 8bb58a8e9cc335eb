"""Redis Cluster through redis-py's public API only: one standalone client per node, the slot map
from ``CLUSTER SLOTS``, ``MOVED`` and ``ASK`` followed.

Why not redis-py's ``RedisCluster``: it loads the ``COMMAND`` table on every topology refresh
(``RedisCluster.initialize``, after every node failure), and parsing that reply in redis-py's
pure-Python parser took ~35 ms of CPU here -- an event-loop stall for every request of the
process, during which no ``asyncio.timeout`` fires. Avoiding it took a subclass of the private
``redis._parsers.commands.AsyncCommandsParser``, and with it an upper bound on redis. The
gateway's commands name their one key (or keys of one slot) where the client can see it, so
this client routes them itself and never needs the table:

- the key's hash slot is CRC16 (XMODEM, :func:`binascii.crc_hqx`) of the key, or of its
  ``{hash tag}``, modulo 16384 -- the Redis Cluster spec's;
- the slot map comes from ``CLUSTER SLOTS`` (as ``RedisCluster``'s does) on any node that
  answers (the one that failed last is asked last), loaded on first use and again after a
  ``MOVED`` or a node's connection error or timeout (the next call reloads it, bounded by its
  own timeout like any command);
- ``MOVED``: the command is sent once more, to the node named, and the map is reloaded on the
  next call; ``ASK``: ``ASKING`` and the command on one connection of the node named;
- a slot no node serves fails with ``ClusterDownError`` (only that slot: the rest is served, as
  ``require_full_coverage=False`` did).

Each node's client is a standalone :class:`redis.asyncio.Redis` with the options the cluster URL
gave (timeouts, no retries, RESP2, credentials), as :func:`gateway.store.connect.connect` makes
for a single Redis, on a plain ``ConnectionPool``: a node whose pool is full fails the command
at once (redis-py 8.1: ``MaxConnectionsError``; 5.2: ``ConnectionError``) instead of queueing,
as ``RedisCluster``'s nodes did -- and it costs less CPU per command than the blocking pool (the
cache path through this client measured level with ``RedisCluster``'s: ~50 µs of CPU per
command either way). Scripts run with ``EVALSHA``
and fall back to ``EVAL`` (which caches the script on that node) on ``NOSCRIPT``.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")
Address = tuple[str, int]
#: one command on a client (a node's, or a pipeline's when it follows an ASK)
Op = Callable[[Any], Any]

SLOTS: Final = 16384


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key`` (its ``{hash tag}`` when it has a non-empty one)."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) % SLOTS


def _redirect(exc: ResponseError) -> tuple[bool, Address] | None:
    """(moved, where) of a ``MOVED`` or ``ASK`` error reply; None for any other error.
    redis-py 8 raises ``MovedError`` / ``AskError`` for them from any client, redis-py 5 only
    from its Cluster client (a plain ``ResponseError`` "MOVED 3999 host:port" otherwise)."""
    if isinstance(exc, AskError):
        return isinstance(exc, MovedError), (exc.host, exc.port)
    kind, _, rest = str(exc).partition(" ")
    if kind not in ("MOVED", "ASK"):
        return None
    host, _, port = rest.partition(" ")[2].rpartition(":")
    return kind == "MOVED", (host, int(port))


class ClusterScript:
    """A Lua script for :class:`ClusterClient`, called as redis-py's registered scripts are:
    ``await script(keys, args)`` (every key in one slot)."""

    __slots__ = ("_client", "_script", "_sha")

    def __init__(self, client: ClusterClient, script: str) -> None:
        self._client = client
        self._script = script
        self._sha = hashlib.sha1(script.encode()).hexdigest()

    async def __call__(
        self, keys: Sequence[Any] | None = None, args: Sequence[Any] | None = None
    ) -> Any:
        keys, args = list(keys or ()), list(args or ())
        key = keys[0] if keys else None
        try:
            return await self._client.run(
                key, lambda c: c.evalsha(self._sha, len(keys), *keys, *args)
            )
        except NoScriptError:  # not cached on that node yet: EVAL caches it
            return await self._client.run(
                key, lambda c: c.eval(self._script, len(keys), *keys, *args)
            )


class ClusterClient:
    """The commands the gateway sends (``get``, ``set``, ``exists``, ``delete``, ``eval``,
    registered scripts), each routed to the node that serves its key's slot."""

    def __init__(self, url: str, *, max_connections: int, **options: Any) -> None:
        first = ConnectionPool.from_url(url, max_connections=max_connections, **options)
        kwargs = dict(first.connection_kwargs)
        self._first: Address = (str(kwargs.pop("host", "localhost")), int(kwargs.pop("port", 6379)))
        kwargs.pop("db", None)  # a cluster has database 0 only
        self._kwargs = kwargs
        self._connection_class = first.connection_class
        self._max_connections = max_connections
        self._nodes: dict[Address, Redis] = {self._first: Redis.from_pool(first)}
        #: per slot: the node that serves it, and its client
        self._slots: list[tuple[Address, Redis] | None] = [None] * SLOTS
        self._stale = True
        self._lock = asyncio.Lock()
        #: the node whose connection failed last (asked last for the slot map)
        self._failed: Address | None = None

    # ------------------------------------------------------------ the commands

    def get(self, key: Any) -> Awaitable[Any]:
        return self.run(key, lambda c: c.get(key))

    def set(self, key: Any, value: Any, **options: Any) -> Awaitable[Any]:
        return self.run(key, lambda c: c.set(key, value, **options))

    def exists(self, key: Any) -> Awaitable[Any]:
        return self.run(key, lambda c: c.exists(key))

    def delete(self, key: Any) -> Awaitable[Any]:
        return self.run(key, lambda c: c.delete(key))

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Awaitable[Any]:
        key = keys_and_args[0] if numkeys > 0 else None
        return self.run(key, lambda c: c.eval(script, numkeys, *keys_and_args))

    def register_script(self, script: str) -> ClusterScript:
        return ClusterScript(self, script)

    async def aclose(self) -> None:
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.aclose()

    # ------------------------------------------------------------ routing

    async def run(self, key: Any, op: Op) -> Any:
        """``op`` on the node that serves ``key``'s slot (any node when ``key`` is None),
        following one redirection."""
        if self._stale:
            await self._refresh()
        if key is None:
            address = self._failed_last(list(self._nodes))[0]
            node = self._node(address)
        else:
            slot = key_slot(key)
            found = self._slots[slot]
            if found is None:
                raise ClusterDownError(f"hash slot {slot} is not served by any node")
            address, node = found
        try:
            return await op(node)
        except ResponseError as exc:
            redirect = _redirect(exc)
            if redirect is None:
                if not isinstance(exc, ClusterError) and str(exc).startswith("CLUSTERDOWN"):
                    # redis-py 5's plain ResponseError: the guard counts it as a failure
                    raise ClusterDownError(str(exc)) from exc
                raise
            moved, target = redirect
            if moved:  # the slot moved (a failover, resharding): go there
                self._stale = True
                return await op(self._node(target))
            # ASK: the slot is migrating and this key has moved already
            return await self._asking(target, op)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            self._stale = True  # a node failed: its slots may be served elsewhere now
            self._failed = address
            raise

    async def _asking(self, address: Address, op: Op) -> Any:
        async with self._node(address).pipeline(transaction=False) as pipe:
            pipe.execute_command("ASKING")
            op(pipe)
            replies = await pipe.execute()
        return replies[1]

    def _node(self, address: Address) -> Redis:
        node = self._nodes.get(address)
        if node is None:
            host, port = address
            pool = ConnectionPool(
                connection_class=self._connection_class,
                max_connections=self._max_connections,
                host=host,
                port=port,
                **self._kwargs,
            )
            node = self._nodes[address] = Redis.from_pool(pool)
        return node

    def _failed_last(self, addresses: list[Address]) -> list[Address]:
        failed = self._failed
        return sorted(addresses, key=lambda a: a == failed)

    async def _refresh(self) -> None:
        """Reload the slot map, one reload at a time (a caller that waited finds it fresh, or
        tries itself when the one before it failed or was cancelled)."""
        async with self._lock:
            if self._stale:
                await self._load_slots()

    async def _load_slots(self) -> None:
        last: Exception | None = None
        for address in self._failed_last(list(dict.fromkeys([self._first, *self._nodes]))):
            try:
                node: Any = self._node(address)  # execute_command is untyped in redis-py
                reply = await node.execute_command("CLUSTER SLOTS")
            except (RedisError, OSError) as exc:
                last = exc
                continue
            slots: list[tuple[Address, Redis] | None] = [None] * SLOTS
            for start, end, primary, *_replicas in reply:
                host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
                if host in ("", "?"):  # the node does not know its own address: the one we used
                    host = address[0]
                where = (host, int(primary[1]))
                serves = (where, self._node(where))
                for slot in range(int(start), int(end) + 1):
                    slots[slot] = serves
            self._slots = slots
            self._stale = False
            return
        assert last is not None
        raise last


__all__ = ["ClusterClient", "ClusterScript", "key_slot"]
