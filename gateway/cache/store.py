"""The cache store seam (docs/architecture.md, habit 7): what the cache needs from a key-value
store.

Two implementations: :class:`gateway.cache.memory.MemoryStore` (the embedded default, one
process) and :class:`gateway.cache.redis.RedisStore` (shared by replicas, docs/spec.md §14). Values
are opaque bytes; what is inside an entry (status, headers, body, when it was stored) is the
caller's business.

A store never makes a request fail: anything that goes wrong (an error, a timeout, the
breaker open) surfaces as :class:`CacheUnavailable`, and the caller serves the request
uncached (``x-gateway-cache: BYPASS``).
"""

from __future__ import annotations

from typing import Protocol

from gateway.store.guard import RedisUnavailable

#: lock keys live beside their entry key
LOCK_SUFFIX = ":lock"


class CacheUnavailable(RedisUnavailable):
    """The store could not answer (error, timeout, breaker open); callers serve the request
    uncached (x-gateway-cache: BYPASS)."""


def lock_key(key: str) -> str:
    return key + LOCK_SUFFIX


class CacheStore(Protocol):
    #: "memory" | "redis"
    name: str

    async def get(self, key: str) -> bytes | None:
        """The entry, or None on a miss (absent or expired). Raises CacheUnavailable."""
        ...

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        """Store (replace) the entry for ``ttl_s`` seconds. Raises CacheUnavailable."""
        ...

    async def try_lock(self, key: str, ttl_s: float) -> str | None:
        """Single-flight lock for ``key`` (across replicas for Redis), held at most ``ttl_s``.

        Returns a token when acquired, None when someone else holds it.
        Raises CacheUnavailable.
        """
        ...

    async def unlock(self, key: str, token: str) -> None:
        """Release the lock only if ``token`` still holds it (compare-and-delete).

        Raises CacheUnavailable.
        """
        ...

    async def get_or_lock(self, key: str, lock_ttl_s: float) -> tuple[bytes | None, str | None]:
        """A lookup that, on a miss, also tries the single-flight lock — one round trip.

        Returns ``(entry, None)`` on a hit, ``(None, token)`` on a miss with the lock taken,
        ``(None, None)`` on a miss while someone else holds it. Raises CacheUnavailable.
        """
        ...

    async def set_and_unlock(self, key: str, value: bytes, ttl_s: float, token: str) -> None:
        """:meth:`set` then :meth:`unlock` — one round trip. Raises CacheUnavailable."""
        ...

    async def wait_for(self, key: str, timeout_s: float) -> bytes | None:
        """Follower side of single flight: wait until the entry appears (return it), the lock
        is gone without an entry (None: the leader failed or did not store) or ``timeout_s``
        passed (None). Raises CacheUnavailable.
        """
        ...

    def state(self) -> str:
        """For /readyz: "ok", or the breaker's "open" / "half_open"."""
        ...

    async def aclose(self) -> None: ...
