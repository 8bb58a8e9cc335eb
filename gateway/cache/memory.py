"""The in-process cache store: a bounded LRU with per-entry TTL (the embedded default).

``get`` runs for every cacheable request, so it is one dict lookup, one clock read and a
``move_to_end``; nothing is allocated. Bounds: at most ``max_entries`` entries and
``max_bytes`` bytes of values (oldest evicted first); a value larger than ``max_bytes`` is
never stored. Expired entries are dropped when read, and are first in line for eviction
anyway since nothing refreshes them.

Single-flight locks work in-process as the Protocol promises, with an :class:`asyncio.Event`
per held lock, so a follower wakes the moment the leader stores or unlocks (no polling).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable

#: prune expired locks (a leader that never unlocked) when this many are held
_LOCK_PRUNE_AT = 1024


class _Lock:
    __slots__ = ("event", "expires", "token")

    def __init__(self, token: str, expires: float) -> None:
        self.token = token
        self.expires = expires
        self.event = asyncio.Event()

    def wake(self) -> None:
        """Wake the current waiters; later waiters get a fresh event."""
        self.event.set()
        self.event = asyncio.Event()


class MemoryStore:
    name = "memory"

    def __init__(
        self, max_entries: int, max_bytes: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be >= 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        #: key -> (value, expires_at); oldest use first
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        self._locks: dict[str, _Lock] = {}
        self._tokens = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes_used(self) -> int:
        """Total size of the stored values."""
        return self._bytes

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._entries[key]
            self._bytes -= len(entry[0])
            return None
        self._entries.move_to_end(key)
        return entry[0]

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        size = len(value)
        if size > self.max_bytes or ttl_s <= 0:
            return
        entries[key] = (value, self._clock() + ttl_s)
        self._bytes += size
        while len(entries) > self.max_entries or self._bytes > self.max_bytes:
            _, (evicted, _) = entries.popitem(last=False)
            self._bytes -= len(evicted)
        lock = self._locks.get(key)
        if lock is not None:
            lock.wake()

    async def try_lock(self, key: str, ttl_s: float) -> str | None:
        now = self._clock()
        held = self._locks.get(key)
        if held is not None:
            if held.expires > now:
                return None
            held.wake()  # expired: its followers re-check and wait on the new holder
        elif len(self._locks) >= _LOCK_PRUNE_AT:
            self._prune_locks(now)
        token = str(next(self._tokens))
        self._locks[key] = _Lock(token, now + ttl_s)
        return token

    async def unlock(self, key: str, token: str) -> None:
        held = self._locks.get(key)
        if held is not None and held.token == token:
            del self._locks[key]
            held.wake()

    async def get_or_lock(self, key: str, lock_ttl_s: float) -> tuple[bytes | None, str | None]:
        value = await self.get(key)
        if value is not None:
            return value, None
        return None, await self.try_lock(key, lock_ttl_s)

    async def set_and_unlock(self, key: str, value: bytes, ttl_s: float, token: str) -> None:
        await self.set(key, value, ttl_s)
        await self.unlock(key, token)

    async def wait_for(self, key: str, timeout_s: float) -> bytes | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            value = await self.get(key)
            if value is not None:
                return value
            held = self._locks.get(key)
            if held is None:
                return None
            lock_left = held.expires - self._clock()
            wait = min(deadline - loop.time(), lock_left)
            if wait <= 0:
                if lock_left <= 0:  # the leader's lock expired: give up like Redis would
                    del self._locks[key]
                    held.wake()
                return None
            try:
                async with asyncio.timeout(wait):
                    await held.event.wait()
            except TimeoutError:
                pass

    def _prune_locks(self, now: float) -> None:
        for key in [k for k, lock in self._locks.items() if lock.expires <= now]:
            self._locks.pop(key).wake()

    def state(self) -> str:
        return "ok"

    async def aclose(self) -> None:
        self._entries.clear()
        self._bytes = 0
        for lock in self._locks.values():
            lock.wake()
        self._locks.clear()
