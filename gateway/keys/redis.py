"""The key store in Redis, shared by the replicas (docs/spec.md §28).

Four keys in one hash slot (``{gw:keys}``): the counter, a hash of records (each value is
``<version>\\n<json>``), a sorted set of record names by version (what changed since a
version) and the epoch: a random mark set (SETNX) by the first write or read of an empty store,
read with the counter, so a replica tells a Redis that came back empty and was written again
from the store it read before, even once the new counter passed what it had seen.
A write is one script: check the version the writer read, bump the counter, store the record
under it, publish the version on :data:`CHANNEL`. Commands go through the store's
guard (timeout, breaker: gateway/store/guard.py); the subscription has a connection of its own
without a read timeout, and is remade when it breaks. Redis keeps the store as durably as it
is configured to: run it with ``appendonly yes`` (AOF, ``appendfsync everysec`` loses at most a
second of changes) for keys that must survive a Redis restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from gateway.keys.records import Conflict, Record, StoreDown, field_of
from gateway.store.guard import GuardedRedis, RedisUnavailable, close_quietly

log = logging.getLogger("gateway.keys")

_TAG = "{gw:keys}"
VERSION_KEY = _TAG + ":ver"
RECORDS_KEY = _TAG + ":rec"
LOG_KEY = _TAG + ":log"
EPOCH_KEY = _TAG + ":epoch"
CHANNEL = "gw:keys:changed"

_WRITE = """
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local curv = 0
if cur then curv = tonumber(string.match(cur, '^(%d+)')) end
if curv ~= tonumber(ARGV[2]) then return -1 end
redis.call('SETNX', KEYS[4], ARGV[5])
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], v .. '\\n' .. ARGV[3])
redis.call('ZADD', KEYS[3], v, ARGV[1])
redis.call('PUBLISH', ARGV[4], v)
return v
"""
#: what changed after a version (a script: the cluster client has no ZRANGEBYSCORE of its own)
_CHANGES = """
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'LIMIT', 0, 4000)
if #names == 0 then return {} end
return redis.call('HMGET', KEYS[2], unpack(names))
"""
#: the counter and the epoch (made here when the store has none)
_HEAD = """
redis.call('SETNX', KEYS[2], ARGV[1])
return {redis.call('GET', KEYS[1]) or '0', redis.call('GET', KEYS[2])}
"""
_GET = "return redis.call('HGET', KEYS[1], ARGV[1])"


class KeyStoreUnavailable(RedisUnavailable):
    """The key store's Redis could not answer."""


def _parse(value: Any) -> Record | None:
    if not isinstance(value, bytes):
        return None
    version, _, body = value.partition(b"\n")
    return {**orjson.loads(body), "version": int(version)}


class RedisKeyStore(GuardedRedis):
    name = "redis"
    error = KeyStoreUnavailable
    what = "key store"
    log = log

    def __init__(self, url: str, timeout_s: float, *, password: str | None, cluster: bool) -> None:
        super().__init__(url, timeout_s, password=password, cluster=cluster, max_connections=8)
        self._url, self._password, self._cluster = url, password, cluster
        self._sub: Redis | None = None
        self._pubsub: PubSub | None = None

    async def _cmd(self, op: Any) -> Any:
        try:
            return await self.call(op)
        except RedisUnavailable as exc:
            raise StoreDown(f"key store: Redis unreachable ({exc})") from exc

    async def version(self) -> int:
        value = await self._cmd(lambda: self.client.get(VERSION_KEY))
        return int(value or 0)

    async def head(self) -> tuple[int, str]:
        mark = secrets.token_hex(8)
        keys = (VERSION_KEY, EPOCH_KEY)
        counter, epoch = await self._cmd(lambda: self.client.eval(_HEAD, 2, *keys, mark))
        return int(counter), epoch.decode() if isinstance(epoch, bytes) else str(epoch)

    async def changes(self, since: int) -> list[Record]:
        values = await self._cmd(lambda: self.client.eval(_CHANGES, 2, LOG_KEY, RECORDS_KEY, since))
        records = [r for r in map(_parse, values) if r is not None]
        return sorted(records, key=lambda r: int(r["version"]))

    async def get(self, name: str) -> Record | None:
        return _parse(await self._cmd(lambda: self.client.eval(_GET, 1, RECORDS_KEY, name)))

    async def write(self, record: Record, expected: int) -> Record:
        body = orjson.dumps({k: v for k, v in record.items() if k != "version"})
        keys = (VERSION_KEY, RECORDS_KEY, LOG_KEY, EPOCH_KEY)
        args = (field_of(record), expected, body, CHANNEL, secrets.token_hex(8))
        version = int(await self._cmd(lambda: self.client.eval(_WRITE, 4, *keys, *args)))
        if version < 0:
            raise Conflict(field_of(record))
        return {**record, "version": version}

    async def wait(self, timeout_s: float) -> None:
        """A published change, or ``timeout_s`` (the catch-up poll's beat)."""
        if self._cluster:  # no subscription through the cluster client: the poll alone
            await asyncio.sleep(timeout_s)
            return
        try:
            pubsub = await self._subscribed()
            async with asyncio.timeout(timeout_s + 1.0):
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout_s)
        except Exception:  # the poll catches up; the subscription is remade next time
            await self._unsubscribe()
            await asyncio.sleep(timeout_s)

    async def _subscribed(self) -> PubSub:
        if self._pubsub is None:
            self._sub = Redis.from_url(
                self._url, password=self._password, socket_connect_timeout=1.0, protocol=2
            )
            pubsub = self._sub.pubsub()
            await pubsub.subscribe(CHANNEL)
            self._pubsub = pubsub
        return self._pubsub

    async def _unsubscribe(self) -> None:
        pubsub, sub = self._pubsub, self._sub
        self._pubsub = self._sub = None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        if sub is not None:
            await close_quietly(sub, log, "key store subscription")

    async def aclose(self) -> None:
        await self._unsubscribe()
        await super().aclose()


__all__ = ["CHANNEL", "KeyStoreUnavailable", "RedisKeyStore"]
