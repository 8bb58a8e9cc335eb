"""One way to call Redis from the request path: every store kept in Redis -- the cache, the
limits, response ownership, MCP sessions -- goes through :class:`RedisGuard`
(docs/architecture.md, "Redis never holds a request up"), and is built on :class:`GuardedRedis`.

Each call waits at most the store's timeout, a circuit breaker stops calling a dead Redis at
all, and every failure surfaces as one exception type per store (a subclass of
:class:`RedisUnavailable`) so the caller takes its fallback. The rule the callers must keep:

**a command that timed out may have run.** ``asyncio.timeout`` cancels this process's wait,
not the command Redis already received (a paused Redis runs it when it wakes). So
:attr:`RedisUnavailable.maybe_ran` is True for any failure after the command could have left
this process -- a timeout, a reset, an error reply -- and False only when nothing was sent
(the breaker was open, our own connection pool was full). A caller whose command is not
idempotent must treat ``maybe_ran`` as "ran": the limiter keys its scripts by request id and
replays them (gateway/budgets/reservations.py); the cache's, ownership's and the sessions'
writes are idempotent already.

A new store kept in Redis subclasses :class:`GuardedRedis` (or uses
:class:`gateway.store.keyvalue.RedisKV`, a prefixed key-value map) and so gets all of this: the
client (:func:`gateway.store.connect.connect`), the breaker, the timeout, its own error type, a
log line when Redis goes and when it comes back, ``state()`` for ``/readyz`` and a shutdown that a
paused Redis cannot hold up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import ClassVar, Final, TypeVar

from redis.exceptions import ClusterError, MaxConnectionsError, ResponseError

from gateway.store.breaker import CircuitBreaker
from gateway.store.connect import DEFAULT_MAX_CONNECTIONS, connect

log = logging.getLogger("gateway")

T = TypeVar("T")

#: the breaker of a store that does not configure its own: open after this many consecutive
#: failures, probe again after this many seconds
BREAKER_FAILURES: Final = 3
BREAKER_RESET_S: Final = 5.0


class RedisUnavailable(Exception):
    """Redis could not answer (error, timeout, breaker open)."""

    def __init__(self, message: str, maybe_ran: bool = True) -> None:
        super().__init__(message)
        #: the command may have run in Redis although no answer came (see the module's rule)
        self.maybe_ran = maybe_ran


class RedisGuard:
    """The timeout, the breaker and the error mapping of one store's Redis calls.

    ``error``: the store's exception class (a :class:`RedisUnavailable`). ``down(exc)`` is
    called once per outage (when the breaker opens, or on every failure with
    ``down_each=True``), ``up()`` when a call succeeds after an outage.
    """

    __slots__ = ("_down", "_error", "_up", "_was_down", "breaker", "timeout_s")

    def __init__(
        self,
        breaker: CircuitBreaker,
        timeout_s: float,
        error: type[RedisUnavailable] = RedisUnavailable,
        down: Callable[[Exception], None] | None = None,
        up: Callable[[], None] | None = None,
    ) -> None:
        self.breaker = breaker
        self.timeout_s = timeout_s
        self._error = error
        self._down = down
        self._up = up
        self._was_down = False

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis command (or script, or pipeline) under the breaker and the timeout."""
        breaker = self.breaker
        if not breaker.allow():
            raise self._error("redis circuit breaker is open", maybe_ran=False)
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await op()
        except MaxConnectionsError as exc:
            # our own pool is full (a load burst): not Redis's failure, no verdict, not sent
            breaker.release()
            raise self._error(f"redis pool exhausted: {exc}", maybe_ran=False) from exc
        except ResponseError as exc:
            if isinstance(exc, ClusterError):  # CLUSTERDOWN, MASTERDOWN: no usable node
                self._failed(exc)
            else:  # Redis answered (OOM, MISCONF, READONLY, a script error): it is alive
                breaker.success()
            raise self._error(f"redis error: {exc}") from exc
        except Exception as exc:  # refused, reset, timeouts, cluster topology errors, ...
            self._failed(exc)
            raise self._error(f"redis unavailable: {type(exc).__name__}: {exc}") from exc
        except BaseException:  # cancelled by the caller: no verdict
            breaker.release()
            raise
        breaker.success()
        if self._was_down:
            self._was_down = False
            if self._up is not None:
                self._up()
        return result

    def _failed(self, exc: Exception) -> None:
        self.breaker.failure()
        if not self._was_down:
            self._was_down = True
            if self._down is not None:
                self._down(exc)

    def state(self) -> str:
        """``ok``, or the breaker's state (``open`` / ``half_open``) while Redis is down."""
        state = self.breaker.state
        return "ok" if state == "closed" else state


async def close_quietly(client: object, log: logging.Logger, what: str) -> None:
    """Close a Redis client at shutdown; a paused Redis must not hold shutdown up."""
    try:
        await client.aclose()  # type: ignore[attr-defined]
    except Exception as exc:
        log.warning("closing the %s client failed: %r", what, exc)


class GuardedRedis:
    """The base of a store kept in Redis: its client, whose every command goes through the
    store's :class:`RedisGuard`.

    A subclass names its error type (``error``, a :class:`RedisUnavailable`) and how its log
    lines name it (``what``), and may say what an outage means for it by overriding
    :meth:`_down` (called once per outage) and :meth:`_up` (when Redis answers again)."""

    #: what every failure of this store surfaces as
    error: ClassVar[type[RedisUnavailable]] = RedisUnavailable
    #: how log lines name the store
    what: ClassVar[str] = "redis"
    #: the logger of its log lines
    log: ClassVar[logging.Logger] = log

    def __init__(
        self,
        url: str,
        timeout_s: float,
        *,
        password: str | None = None,
        cluster: bool = False,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.breaker = breaker or CircuitBreaker(BREAKER_FAILURES, BREAKER_RESET_S)
        self.guard = RedisGuard(self.breaker, timeout_s, self.error, self._down, self._up)
        # connects lazily: a dead Redis never stops a start
        self.client = connect(
            url, timeout_s, password=password, cluster=cluster, max_connections=max_connections
        )

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """One command (or script, or pipeline) under the breaker and the timeout; any failure
        raises the store's ``error``."""
        return await self.guard.call(op)

    def _down(self, exc: Exception) -> None:
        self.log.warning("%s: Redis unreachable (%s)", self.what, type(exc).__name__)

    def _up(self) -> None:
        self.log.warning("%s: Redis is back", self.what)

    def state(self) -> str:
        """``ok``, or the breaker's state (``open`` / ``half_open``) while Redis is down."""
        return self.guard.state()

    async def aclose(self) -> None:
        await close_quietly(self.client, self.log, self.what)


__all__ = [
    "BREAKER_FAILURES",
    "BREAKER_RESET_S",
    "GuardedRedis",
    "RedisGuard",
    "RedisUnavailable",
    "close_quietly",
]
