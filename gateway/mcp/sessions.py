"""MCP sessions: the client's ``Mcp-Session-Id`` (the gateway's own) mapped to the upstreams'
(docs/spec.md §23).

A session record says whose it is (the key's limiter id: a session is never served to another
key, so tenants never share one), which endpoint made it (``/mcp/{server}`` or ``/mcp``), and
per upstream server its session id and negotiated protocol version. The client only ever sees
the gateway's id: an upstream's id never leaves the gateway.

Where records live: in this process (a bounded LRU), and in Redis when one is configured
(``auth.redis_url``, else the ``[cache]`` Redis) so that two replicas serve the same session.
With Redis, a lookup asks Redis first (a record changes when ``/mcp`` opens a session on one
more server) and this process's copy only when Redis cannot answer; every Redis command is
bounded by the Redis timeout and a circuit breaker stops calling a dead one.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.config import Config
from gateway.store.connect import shared_redis
from gateway.store.guard import RedisUnavailable
from gateway.store.keyvalue import RedisKV

log = logging.getLogger("gateway")

LOCAL_MAX = 10_000
#: a session nobody used for a day is forgotten
TTL_S = 86_400
#: session ids are the gateway's own (32 hex): anything else is never looked up
_ID_CHARS = 32


class Session:
    """One client session: whose, made by which endpoint, and its upstream sessions."""

    __slots__ = ("endpoint", "id", "owner", "upstream")

    def __init__(
        self,
        owner: str,
        endpoint: str,
        upstream: dict[str, list[str]] | None = None,
        sid: str | None = None,
    ) -> None:
        self.id = sid or secrets.token_hex(_ID_CHARS // 2)
        self.owner = owner
        self.endpoint = endpoint
        #: server name -> [its session id ("" when it keeps none), its protocol version]
        self.upstream: dict[str, list[str]] = upstream if upstream is not None else {}

    def dumps(self) -> str:
        return orjson.dumps({"o": self.owner, "e": self.endpoint, "u": self.upstream}).decode()

    @classmethod
    def loads(cls, sid: str, raw: str) -> Session | None:
        try:
            data: Any = orjson.loads(raw)
            return cls(str(data["o"]), str(data["e"]), dict(data["u"]), sid)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


class SessionsUnavailable(RedisUnavailable):
    """Redis could not answer the session store."""


class RedisSessions(RedisKV):
    """The records in Redis, shared by the replicas."""

    error = SessionsUnavailable
    what = "mcp sessions"

    def _down(self, exc: Exception) -> None:
        log.warning(
            "mcp sessions: Redis unreachable (%s); each replica serves the sessions "
            "it made until it is back",
            type(exc).__name__,
        )

    def _up(self) -> None:
        log.warning("mcp sessions: Redis is back; replicas share sessions again")


class Sessions:
    """The records: this process's LRU, and Redis when configured."""

    def __init__(
        self,
        url: str | None = None,
        timeout_ms: float = 50.0,
        *,
        namespace: str = "default",
        password: str | None = None,
        cluster: bool = False,
    ) -> None:
        self._local: OrderedDict[str, str] = OrderedDict()
        self._shared: RedisSessions | None = None
        if url is not None:  # connects lazily: a dead Redis never stops a start
            self._shared = RedisSessions(
                f"gateway:mcp-session:v1:{namespace}:",
                url,
                timeout_ms / 1000.0,
                password=password,
                cluster=cluster,
            )

    @property
    def shared(self) -> bool:
        return self._shared is not None

    async def get(self, sid: str) -> Session | None:
        if len(sid) != _ID_CHARS or not all(c in "0123456789abcdef" for c in sid):
            return None
        raw: str | None = None
        shared = self._shared
        if shared is not None:
            try:
                raw = await shared.get(sid)
                if raw is None:
                    self._local.pop(sid, None)  # ended on another replica
                    return None
            except SessionsUnavailable:
                raw = None
        if raw is None:
            raw = self._local.get(sid)
        return Session.loads(sid, raw) if raw is not None else None

    async def put(self, session: Session) -> None:
        raw = session.dumps()
        local = self._local
        local[session.id] = raw
        local.move_to_end(session.id)
        while len(local) > LOCAL_MAX:
            local.popitem(last=False)
        if self._shared is not None:
            with contextlib.suppress(SessionsUnavailable):  # kept here: this replica serves it
                await self._shared.set(session.id, raw, TTL_S)

    async def delete(self, sid: str) -> None:
        self._local.pop(sid, None)
        if self._shared is not None:
            with contextlib.suppress(SessionsUnavailable):
                await self._shared.delete(sid)

    async def aclose(self) -> None:
        if self._shared is not None:
            await self._shared.aclose()


def build_sessions(config: Config, environ: Mapping[str, str] | None = None) -> Sessions:
    """Redis as for response ownership: ``auth.redis_url``, else the ``[cache]`` Redis."""
    redis = shared_redis(config, environ)
    if redis is None:
        return Sessions(namespace=config.cache.namespace)
    return Sessions(
        redis.url,
        redis.timeout_ms,
        namespace=config.cache.namespace,
        password=redis.password,
        cluster=redis.cluster,
    )


__all__ = ["RedisSessions", "Session", "Sessions", "SessionsUnavailable", "build_sessions"]
