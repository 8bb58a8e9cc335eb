"""One way to call Redis from the request path: the cache, the limiter and response ownership
all go through :class:`RedisGuard` (docs/architecture.md, "Redis never holds a request up").

Each call waits at most the store's timeout, a circuit breaker stops calling a dead Redis at
all, and every failure surfaces as one exception type per store (a subclass of
:class:`RedisUnavailable`) so the caller takes its fallback. The rule the callers must keep:

**a command that timed out may have run.** ``asyncio.timeout`` cancels this process's wait,
not the command Redis already received (a paused Redis runs it when it wakes). So
:attr:`RedisUnavailable.maybe_ran` is True for any failure after the command could have left
this process -- a timeout, a reset, an error reply -- and False only when nothing was sent
(the breaker was open, our own connection pool was full). A caller whose command is not
idempotent must treat ``maybe_ran`` as "ran": the limiter keys its scripts by request id and
replays them (gateway/hops/reservations.py); the cache's and ownership's writes are
idempotent already.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ClusterError, MaxConnectionsError, ResponseError

from gateway.cache.breaker import CircuitBreaker

T = TypeVar("T")


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


__all__ = ["RedisGuard", "RedisUnavailable", "close_quietly"]
