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
import os
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson

from gateway.cache.breaker import CircuitBreaker
from gateway.cache.guard import RedisGuard, RedisUnavailable, close_quietly
from gateway.cache.redis import connect
from gateway.config import Config

log = logging.getLogger("gateway")
T = TypeVar("T")

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

    def dumps(self) -> bytes:
        return orjson.dumps({"o": self.owner, "e": self.endpoint, "u": self.upstream})

    @classmethod
    def loads(cls, sid: str, raw: bytes) -> Session | None:
        try:
            data: Any = orjson.loads(raw)
            return cls(str(data["o"]), str(data["e"]), dict(data["u"]), sid)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


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
        self._local: OrderedDict[str, bytes] = OrderedDict()
        self._client = None
        self._timeout = timeout_ms / 1000.0
        self._guard = RedisGuard(CircuitBreaker(3, 5.0), self._timeout, _Unavailable, self._down)
        self._prefix = f"gateway:mcp-session:v1:{namespace}:"
        if url is not None:  # connects lazily: a dead Redis never stops a start
            self._client = connect(url, self._timeout, password=password, cluster=cluster)

    @property
    def shared(self) -> bool:
        return self._client is not None

    async def get(self, sid: str) -> Session | None:
        if len(sid) != _ID_CHARS or not all(c in "0123456789abcdef" for c in sid):
            return None
        raw: bytes | None = None
        client = self._client
        if client is not None:
            try:
                value = await self._call(lambda: client.get(self._prefix + sid))
                raw = value if isinstance(value, bytes) else None
                if raw is None:
                    self._local.pop(sid, None)  # ended on another replica
                    return None
            except _Unavailable:
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
        client = self._client
        if client is not None:
            with contextlib.suppress(_Unavailable):  # kept here: this replica still serves it
                await self._call(lambda: client.set(self._prefix + session.id, raw, ex=TTL_S))

    async def delete(self, sid: str) -> None:
        self._local.pop(sid, None)
        client = self._client
        if client is not None:
            with contextlib.suppress(_Unavailable):
                await self._call(lambda: client.delete(self._prefix + sid))

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        return await self._guard.call(op)

    @staticmethod
    def _down(exc: Exception) -> None:
        log.warning(
            "mcp sessions: Redis unreachable (%s); each replica serves the sessions "
            "it made until it is back",
            type(exc).__name__,
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await close_quietly(self._client, log, "mcp sessions")


class _Unavailable(RedisUnavailable):
    """Redis could not answer the session store."""


def build_sessions(config: Config, environ: Mapping[str, str] | None = None) -> Sessions:
    """Redis as for response ownership: ``auth.redis_url``, else the ``[cache]`` Redis."""
    env = os.environ if environ is None else environ
    url, password, cluster = config.auth.redis_url, None, False
    timeout_ms = config.auth.timeout_ms
    if url is None and config.cache.backend == "redis":
        url, cluster, timeout_ms = config.cache.url, config.cache.cluster, config.cache.timeout_ms
        if config.cache.password_env:
            password = env.get(config.cache.password_env)
    return Sessions(
        url, timeout_ms, namespace=config.cache.namespace, password=password, cluster=cluster
    )


__all__ = ["Session", "Sessions", "build_sessions"]
