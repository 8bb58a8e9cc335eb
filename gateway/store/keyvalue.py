"""A key-value map shared by the replicas, and its in-memory twin: what response ownership and
MCP sessions keep their records in, and what a new store of records with a lifetime builds on.

:class:`RedisKV` is a namespace of keys (its ``prefix``) in Redis, standalone or Cluster (one key
per record), each command through the store's guard (:class:`gateway.store.guard.GuardedRedis`:
the timeout, the breaker, the store's own error type). :class:`MemoryKV` is the same map in this
process: a bounded LRU, each entry expiring after its own TTL. Both answer :class:`KeyValue`, so a
store can keep a local copy, a shared one, or both, and tests can run one beside the other.

>>> kv = MemoryKV(max_entries=2, clock=lambda: 0.0)
>>> kv.set_now("a", "1", 10.0); kv.set_now("b", "2", 10.0); kv.set_now("c", "3", 10.0)
>>> kv.get_now("a") is None, kv.get_now("c"), len(kv)   # the oldest went beyond the bound
(True, '3', 2)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

from gateway.store.breaker import CircuitBreaker
from gateway.store.connect import DEFAULT_MAX_CONNECTIONS
from gateway.store.guard import GuardedRedis

#: what :meth:`KeyValue.claim` stores under the name it claims
CLAIMED: Final = "claimed"


class KeyValue(Protocol):
    """Records with a lifetime, by key. The Redis map raises its store's error
    (a :class:`gateway.store.guard.RedisUnavailable`) when Redis cannot answer."""

    async def get(self, key: str) -> str | None:
        """The value, or None (unknown or expired)."""
        ...

    async def set(self, key: str, value: str, ttl_s: float) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def claim(self, key: str, ttl_s: float) -> bool:
        """Set ``key`` unless it is set: True for the one caller that set it."""
        ...

    def state(self) -> str:
        """``ok``, or the breaker's state (``open`` / ``half_open``) while Redis is down."""
        ...

    async def aclose(self) -> None: ...


class MemoryKV:
    """A bounded LRU in this process; each entry expires after its own TTL."""

    __slots__ = ("_clock", "_entries", "max_entries")

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self._clock = clock
        #: key -> (value, monotonic expiry), least recently used first
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get_now(self, key: str) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def set_now(self, key: str, value: str, ttl_s: float) -> None:
        entries = self._entries
        # a new key goes in at the most recent end (a repeated one keeps its place, with the
        # new expiry)
        entries[key] = (value, self._clock() + ttl_s)
        if len(entries) > self.max_entries:
            entries.popitem(last=False)

    def delete_now(self, key: str) -> None:
        self._entries.pop(key, None)

    async def get(self, key: str) -> str | None:
        return self.get_now(key)

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        self.set_now(key, value, ttl_s)

    async def delete(self, key: str) -> None:
        self.delete_now(key)

    async def claim(self, key: str, ttl_s: float) -> bool:
        if self.get_now(key) is not None:
            return False
        self.set_now(key, CLAIMED, ttl_s)
        return True

    def state(self) -> str:
        return "ok"

    async def aclose(self) -> None:
        """Nothing to release."""


class RedisKV(GuardedRedis):
    """The map in Redis under ``prefix`` (one key per record, ``EX`` its TTL in whole seconds,
    at least one). Values are text (UTF-8)."""

    def __init__(
        self,
        prefix: str,
        url: str,
        timeout_s: float,
        *,
        password: str | None = None,
        cluster: bool = False,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        super().__init__(
            url,
            timeout_s,
            password=password,
            cluster=cluster,
            max_connections=max_connections,
            breaker=breaker,
        )
        self.prefix = prefix

    async def get(self, key: str) -> str | None:
        value = await self.call(lambda: self.client.get(self.prefix + key))
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else None

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        ttl = max(1, int(ttl_s))
        await self.call(lambda: self.client.set(self.prefix + key, value, ex=ttl))

    async def delete(self, key: str) -> None:
        await self.call(lambda: self.client.delete(self.prefix + key))

    async def claim(self, key: str, ttl_s: float) -> bool:
        ttl = max(1, int(ttl_s))
        done = await self.call(lambda: self.client.set(self.prefix + key, CLAIMED, ex=ttl, nx=True))
        return bool(done)


__all__ = ["CLAIMED", "KeyValue", "MemoryKV", "RedisKV"]
