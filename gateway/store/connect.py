"""Making a Redis client every store of the gateway can use, and finding which Redis it is.

:func:`connect` makes the one kind of client the stores use (the cache, the limits, response
ownership, MCP sessions): every socket read and connect bounded by the store's timeout, no
client-side retries (a retry would double the wait; redis-py's retry of the connect is off too),
RESP2, and for a standalone Redis a ``BlockingConnectionPool`` that waits for a free connection at
most the timeout (then fails) rather than queueing forever; Redis Cluster goes through
:class:`gateway.store.cluster.ClusterClient` (a standalone client per node), whose nodes fail at
once when their pool is full. Only redis-py's public API is used. A client connects lazily: a
dead Redis never stops a start.

:func:`shared_redis` says which Redis the stores shared by the replicas use (docs/spec.md §12):
``auth.redis_url`` when set, else the ``[cache]`` Redis (with its password and cluster mode),
else none -- each replica then keeps that state in its own process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.config import Config
from gateway.store.cluster import ClusterClient

#: connections per process (per node for Cluster); a command takes ~0.1 ms on a LAN
DEFAULT_MAX_CONNECTIONS: Final = 64


def connect(
    url: str,
    timeout_s: float,
    *,
    password: str | None = None,
    cluster: bool = False,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> Redis | ClusterClient:
    """A client whose every socket read and connect is bounded by ``timeout_s``, with no
    client-side retries, speaking RESP2."""
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
        "health_check_interval": 0,
        # RESP2, not redis-py 8's default RESP3: RESP3 turns on maintenance notifications
        # ("auto"), and with them on the pool skips its check that a pooled connection has
        # no unread data or EOF (``ConnectionPool.ensure_connection``), so each idle
        # connection to a restarted Redis would fail one request instead of reconnecting.
        "protocol": 2,
    }
    if password is not None:
        # a password in the URL wins over this one (redis-py: URL options win)
        common["password"] = password
    if cluster:
        # gateway/store/cluster.py: slots routed here, no COMMAND table (why: its module)
        return ClusterClient(url, max_connections=max_connections, **common)
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout_s, **common
    )
    return Redis.from_pool(pool)


@dataclass(frozen=True, slots=True)
class SharedRedis:
    """The Redis the replicas share their state in, as the config names it."""

    url: str
    #: the ``[cache]`` Redis's password (from ``cache.password_env``); None: none, or in the URL
    password: str | None
    cluster: bool
    #: the timeout of the config section that named it (``auth.timeout_ms``, else the cache's)
    timeout_ms: float


def shared_redis(config: Config, environ: Mapping[str, str] | None = None) -> SharedRedis | None:
    """``auth.redis_url`` when set, else the ``[cache]`` Redis, else None (per process)."""
    if config.auth.redis_url is not None:
        return SharedRedis(config.auth.redis_url, None, False, config.auth.timeout_ms)
    cache = config.cache
    if cache.backend != "redis":
        return None
    env = os.environ if environ is None else environ
    password = env.get(cache.password_env) if cache.password_env else None
    return SharedRedis(cache.url, password, cache.cluster, cache.timeout_ms)


__all__ = ["DEFAULT_MAX_CONNECTIONS", "SharedRedis", "connect", "shared_redis"]
