"""The Redis cache store (standalone or Cluster), which must never hold a request up.

A request waits for Redis at most ``cache.timeout_ms`` per command, however Redis fails:

- *refused / killed*: redis-py raises ``ConnectionError`` at once;
- *black-holed* (SIGSTOP, a dead host behind a live port): ``socket_timeout`` /
  ``socket_connect_timeout`` bound each socket read and connect, and every call is also
  wrapped in ``asyncio.timeout`` as the outer bound (a command can involve a connect, the
  handshake and the command itself, each bounded only on its own by redis-py);
- *dead for a while*: after ``breaker_failures`` consecutive failures the circuit breaker
  opens and calls fail at once without touching the network; after ``breaker_reset_s``
  one probe goes out, and a success resumes caching -- no restart needed.

The client is the one every store uses (:func:`gateway.store.connect.connect`), and every
command goes through the store's guard (:class:`gateway.store.guard.GuardedRedis`).
Client-side retries are off (a retry would double the wait), and redis-py's own retry of the
connect is off too. The standalone pool is a ``BlockingConnectionPool`` that waits for a free
connection at most the timeout (then fails) rather than queueing forever; Redis Cluster goes
through :class:`gateway.store.cluster.ClusterClient` (a standalone client per node), whose
nodes fail at once when their pool is full. Only redis-py's public API is used.

A timed-out or cancelled command leaves a half-read reply on its socket. redis-py disconnects
the connection on any exception while sending or reading (``redis/asyncio/connection.py``:
the ``except BaseException`` branches of ``AbstractConnection.send_packed_command`` and
``read_response``), and the pool checks each connection it hands out for unread data or EOF
(``ConnectionPool.ensure_connection``) -- a check redis-py 8 skips under its default RESP3,
which is why this store speaks RESP2. So a later command cannot read an earlier command's
reply (tested with a paused server and with a reply cut off mid-way), and idle connections to
a Redis that was restarted reconnect instead of failing a request each.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from typing import Final

from gateway.cache.store import CacheUnavailable, lock_key
from gateway.config import CacheConfig
from gateway.store.breaker import CircuitBreaker
from gateway.store.connect import DEFAULT_MAX_CONNECTIONS
from gateway.store.guard import GuardedRedis

log = logging.getLogger("gateway.cache")

#: follower polling: start fast (the leader may be nearly done), back off to this
_POLL_FIRST_S: Final = 0.005
_POLL_MAX_S: Final = 0.05

# Compare-and-delete: release the lock only while it still holds our token (a lock that
# expired and was taken by another replica must not be released by us).
_UNLOCK_LUA: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


# Lookup + lock in one round trip (entry and lock share a Cluster slot: see keys.cache_key).
_GET_OR_LOCK_LUA: Final = """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0, 1} end
return {0, 0}
"""
# Store + compare-and-delete of our lock in one round trip.
_SET_AND_UNLOCK_LUA: Final = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return 1
"""


def _ttl_ms(ttl_s: float) -> int:
    return max(1, int(ttl_s * 1000))


class RedisStore(GuardedRedis):
    name = "redis"
    error = CacheUnavailable
    what = "redis"
    log = log

    def __init__(
        self,
        cfg: CacheConfig,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        password: str | None = None
        if cfg.password_env:
            password = os.environ.get(cfg.password_env)
            if password is None:
                raise ValueError(
                    f"cache.password_env: environment variable {cfg.password_env} is not set"
                )
        self._url = cfg.url
        super().__init__(
            cfg.url,
            cfg.timeout_ms / 1000.0,
            password=password,
            cluster=cfg.cluster,
            max_connections=max_connections,
            breaker=breaker or CircuitBreaker(cfg.breaker_failures, cfg.breaker_reset_s),
        )

    def _down(self, exc: Exception) -> None:
        log.warning(
            "redis cache %s unavailable (%s: %s); serving uncached, retrying in %.1fs",
            self._url_for_log,
            type(exc).__name__,
            exc,
            self.breaker.reset_s,
        )

    def _up(self) -> None:
        log.info("redis cache %s is back; caching resumes", self._url_for_log)

    @property
    def _url_for_log(self) -> str:
        # never log credentials that may sit in the URL (userinfo, or ?password= for unix://)
        scheme, sep, rest = self._url.partition("://")
        return scheme + sep + rest.rpartition("@")[2].partition("?")[0]

    # ------------------------------------------------------------ the store

    async def get(self, key: str) -> bytes | None:
        value = await self.call(lambda: self.client.get(key))
        if value is None or isinstance(value, bytes):
            return value
        raise CacheUnavailable(f"redis returned {type(value).__name__}, expected bytes")

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        if ttl_s <= 0:  # no lifetime: nothing to store (as MemoryStore)
            return
        await self.call(lambda: self.client.set(key, value, px=_ttl_ms(ttl_s)))

    async def try_lock(self, key: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        acquired = await self.call(
            lambda: self.client.set(lock_key(key), token, px=_ttl_ms(ttl_s), nx=True)
        )
        return token if acquired else None

    async def unlock(self, key: str, token: str) -> None:
        await self.call(lambda: self._eval_unlock(lock_key(key), token))

    async def _eval_unlock(self, lock: str, token: str) -> object:
        # EVAL, not EVALSHA: the script is tiny and this saves the NOSCRIPT round trip
        return await self.client.eval(_UNLOCK_LUA, 1, lock, token)

    async def get_or_lock(self, key: str, lock_ttl_s: float) -> tuple[bytes | None, str | None]:
        token = secrets.token_hex(16)
        reply = await self.call(
            lambda: self.client.eval(
                _GET_OR_LOCK_LUA, 2, key, lock_key(key), token, _ttl_ms(lock_ttl_s)
            )
        )
        if not isinstance(reply, list) or len(reply) != 2:
            raise CacheUnavailable(f"redis returned {reply!r} for get-or-lock")
        found, value = reply
        if found == 1:
            if not isinstance(value, bytes):
                raise CacheUnavailable(f"redis returned {type(value).__name__}, expected bytes")
            return value, None
        return None, token if value == 1 else None

    async def set_and_unlock(self, key: str, value: bytes, ttl_s: float, token: str) -> None:
        ttl = _ttl_ms(ttl_s) if ttl_s > 0 else 1
        await self.call(
            lambda: self.client.eval(_SET_AND_UNLOCK_LUA, 2, key, lock_key(key), value, ttl, token)
        )

    async def _locked(self, key: str) -> bool:
        return bool(await self.call(lambda: self.client.exists(lock_key(key))))

    async def wait_for(self, key: str, timeout_s: float) -> bytes | None:
        delay = _POLL_FIRST_S
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    value = await self.get(key)
                    if value is not None:
                        return value
                    if not await self._locked(key):
                        # the leader may have stored and unlocked between our two reads
                        return await self.get(key)
                    # the loop keeps its own deadline too: a cancellation the timeout sends
                    # while a command is in flight can be swallowed inside the Redis client
                    # (seen once in CI: a 0.3 s wait lasted until the 60 s lock expired)
                    left = deadline - loop.time()
                    if left <= 0:
                        return None
                    await asyncio.sleep(min(delay, left))
                    delay = min(delay * 2, _POLL_MAX_S)
        except TimeoutError:
            return None
