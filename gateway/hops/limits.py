"""Per-key rate limits: requests and tokens per minute, shared by replicas (SPEC §12).

Both limits are GCRA (the generic cell rate algorithm: a token bucket kept as one timestamp,
the *theoretical arrival time* ``tat``). A key with ``rpm = N`` may send N requests at once, then
one every 60/N s; its bucket is full again 60 s after it stops. ``tpm`` works the same way in
tokens, with one difference: a request's tokens are known only when its answer is (the usage the
upstream reports, streams included), so a request is admitted while the key has *any* token
budget left and its tokens are debited afterwards. A key that overdraws is refused until its
bucket is back above zero: "refused until its window frees up".

::

    used  = max(tat - now, 0)            # seconds of the 60 s window already spent
    rpm:  admit iff used + 60/rpm <= 60;  then tat = max(tat, now) + 60/rpm
    tpm:  admit iff used < 60;            after the answer tat = max(tat, now) + tokens * 60/tpm

With Redis (``auth.redis_url``, or the ``[cache]`` Redis) the check is one Lua script — one round
trip, atomic, on Redis's own clock (``TIME``), so replicas with skewed clocks share one budget —
and the debit another. Each command waits at most ``auth.timeout_ms``; a circuit breaker stops
calling a dead Redis at all. While Redis is unreachable the limits are counted here, per process
(never unlimited, never a wait), ``gateway_ratelimit_fallback`` is 1 and a warning is logged;
the first command that succeeds again ends the fallback (and logs it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from gateway.cache.breaker import CircuitBreaker
from gateway.cache.redis import connect
from gateway.memo import remember

log = logging.getLogger("gateway.auth")

WINDOW_S: Final = 60.0
#: breaker for the limiter's Redis (as the cache's defaults)
_BREAKER_FAILURES: Final = 3
_BREAKER_RESET_S: Final = 5.0
#: per-process state is bounded: one entry per configured key and limit
_MEMORY_MAX: Final = 100_000


@dataclass(slots=True)  # not frozen: one is made per request, and frozen init is slow
class Verdict:
    """One check's outcome, with what the ``x-ratelimit-*`` headers say (OpenAI's names)."""

    allowed: bool
    #: seconds until a refused request would be admitted (0 when allowed)
    retry_after_s: float = 0.0
    #: which limit refused: "requests" | "tokens" | None
    refused_by: str | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    #: seconds until the bucket is full again
    reset_requests_s: float = 0.0
    reset_tokens_s: float = 0.0


def check_gcra(
    now: float, r_tat: float | None, t_tat: float | None, rpm: int | None, tpm: int | None
) -> tuple[Verdict, float | None]:
    """The check, on plain numbers (the Lua script does the same arithmetic).

    Returns the verdict and the new request ``tat`` to store (None: unchanged).

    >>> v, tat = check_gcra(100.0, None, None, 2, None)
    >>> v.allowed, v.remaining_requests, tat
    (True, 1, 130.0)
    >>> v, tat = check_gcra(100.0, 130.0, None, 2, None)
    >>> v.allowed, v.remaining_requests, tat
    (True, 0, 160.0)
    >>> v, tat = check_gcra(100.0, 160.0, None, 2, None)
    >>> v.allowed, v.refused_by, v.retry_after_s, tat
    (False, 'requests', 30.0, None)
    >>> check_gcra(100.0, None, 161.0, None, 600)[0].refused_by   # 61 s of tokens spent
    'tokens'
    """
    remaining_t = None
    reset_t = 0.0
    if tpm:
        per_token = WINDOW_S / tpm
        used_t = max((t_tat or now) - now, 0.0)
        if used_t >= WINDOW_S:
            retry = used_t - WINDOW_S + per_token
            return Verdict(False, retry, "tokens", None, 0, 0.0, used_t), None
        remaining_t = int((WINDOW_S - used_t) / per_token)
        reset_t = used_t
    if not rpm:
        return Verdict(True, 0.0, None, None, remaining_t, 0.0, reset_t), None
    per_request = WINDOW_S / rpm
    new_tat = max(r_tat or now, now) + per_request
    used_r = new_tat - now
    if used_r > WINDOW_S + 1e-9:
        retry = used_r - WINDOW_S
        return Verdict(
            False, retry, "requests", 0, remaining_t, used_r - per_request, reset_t
        ), None
    remaining_r = int((WINDOW_S - used_r) / per_request + 1e-9)
    return Verdict(True, 0.0, None, remaining_r, remaining_t, used_r, reset_t), new_tat


def debit_gcra(now: float, t_tat: float | None, tokens: int, tpm: int) -> float:
    """The new token ``tat`` after ``tokens`` were spent.

    >>> debit_gcra(100.0, None, 300, 600)
    130.0
    """
    return max(t_tat or now, now) + tokens * (WINDOW_S / tpm)


class Limits(Protocol):
    """Where the limiter keeps its buckets (per process, or Redis)."""

    #: True while the limits are counted per process because their shared store is unreachable
    fallback: bool

    async def check(self, key: str, rpm: int | None, tpm: int | None) -> Verdict: ...

    async def debit(self, key: str, tokens: int, tpm: int) -> None: ...

    async def aclose(self) -> None: ...


class MemoryLimits:
    """The buckets in this process (``time.monotonic``)."""

    #: the buckets are here: never a fallback
    fallback = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tat: dict[str, float] = {}

    def check_now(self, key: str, rpm: int | None, tpm: int | None) -> Verdict:
        now = self._clock()
        verdict, new_tat = check_gcra(
            now, self._tat.get(key + ":r"), self._tat.get(key + ":t"), rpm, tpm
        )
        if new_tat is not None:
            remember(self._tat, key + ":r", new_tat, _MEMORY_MAX)
        return verdict

    def debit_now(self, key: str, tokens: int, tpm: int) -> None:
        now = self._clock()
        remember(
            self._tat,
            key + ":t",
            debit_gcra(now, self._tat.get(key + ":t"), tokens, tpm),
            _MEMORY_MAX,
        )

    async def check(self, key: str, rpm: int | None, tpm: int | None) -> Verdict:
        return self.check_now(key, rpm, tpm)

    async def debit(self, key: str, tokens: int, tpm: int) -> None:
        self.debit_now(key, tokens, tpm)

    async def aclose(self) -> None:
        """Nothing to release."""


# The check of check_gcra, atomically on Redis's clock (µs integers; Lua numbers are doubles,
# exact far beyond these magnitudes). KEYS: requests tat, tokens tat; ARGV: rpm, tpm (0 = none).
# Returns {allowed, retry_us, remaining_requests (-1 none), remaining_tokens (-1 none),
#          reset_requests_us, reset_tokens_us, refused_by (0 none, 1 requests, 2 tokens)}.
_CHECK_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = 60000000
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local rem_t = -1
local reset_t = 0
if tpm > 0 then
  local per = window / tpm
  local tat = tonumber(redis.call('GET', KEYS[2]) or now)
  local used = math.max(tat - now, 0)
  if used >= window then
    return {0, math.ceil(used - window + per), -1, 0, 0, math.ceil(used), 2}
  end
  rem_t = math.floor((window - used) / per)
  reset_t = math.ceil(used)
end
if rpm <= 0 then
  return {1, 0, -1, rem_t, 0, reset_t, 0}
end
local per = window / rpm
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
local new = math.max(tat, now) + per
local used = new - now
if used > window + 1 then
  return {0, math.ceil(used - window), 0, rem_t, math.ceil(used - per), reset_t, 1}
end
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil(used / 1000) + 1000)
return {1, 0, math.floor((window - used) / per + 0.000001), rem_t, math.ceil(used), reset_t, 0}
"""
# The debit: KEYS: tokens tat; ARGV: tokens, tpm.
_DEBIT_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
local new = math.max(tat, now) + tonumber(ARGV[1]) * (60000000 / tonumber(ARGV[2]))
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1000)
return 1
"""


class LimitsUnavailable(Exception):
    """Redis could not answer within the bound (or the breaker is open)."""


class RedisLimits:
    """The buckets in Redis (standalone or Cluster: both keys of a limit share a hash tag),
    with the per-process :class:`MemoryLimits` standing in while Redis is unreachable."""

    def __init__(
        self,
        url: str,
        timeout_ms: float,
        password: str | None = None,
        cluster: bool = False,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self._timeout = timeout_ms / 1000.0
        self._client = connect(url, self._timeout, password=password, cluster=cluster)
        self._breaker = breaker or CircuitBreaker(_BREAKER_FAILURES, _BREAKER_RESET_S)
        self.local = MemoryLimits()
        #: True while limits are counted per process because Redis is unreachable
        self.fallback = False

    @staticmethod
    def _keys(key: str) -> tuple[str, str]:
        base = "gateway:ratelimit:v1:{" + key + "}"
        return base + ":r", base + ":t"

    async def _call(self, op: Callable[[], Awaitable[Any]]) -> Any:
        breaker = self._breaker
        if not breaker.allow():
            raise LimitsUnavailable("circuit breaker open")
        try:
            async with asyncio.timeout(self._timeout):
                reply = await op()
        except Exception as exc:
            breaker.failure()
            self._enter_fallback(exc)
            raise LimitsUnavailable(str(exc)) from exc
        except BaseException:
            breaker.release()
            raise
        breaker.success()
        if self.fallback:
            self.fallback = False
            log.warning("rate limits: Redis is back; limits are shared by the replicas again")
        return reply

    def _enter_fallback(self, exc: Exception) -> None:
        if not self.fallback:
            self.fallback = True
            log.warning(
                "rate limits: Redis unreachable (%s); counting limits per process until it is back",
                type(exc).__name__,
            )

    async def check(self, key: str, rpm: int | None, tpm: int | None) -> Verdict:
        r_key, t_key = self._keys(key)
        try:
            reply = await self._call(
                lambda: self._client.eval(_CHECK_LUA, 2, r_key, t_key, rpm or 0, tpm or 0)
            )
        except LimitsUnavailable:
            return self.local.check_now(key, rpm, tpm)
        allowed, retry_us, rem_r, rem_t, reset_r, reset_t, by = (int(x) for x in reply)
        return Verdict(
            allowed == 1,
            retry_us / 1e6,
            (None, "requests", "tokens")[by],
            None if rem_r < 0 else rem_r,
            None if rem_t < 0 else rem_t,
            reset_r / 1e6,
            reset_t / 1e6,
        )

    async def debit(self, key: str, tokens: int, tpm: int) -> None:
        _, t_key = self._keys(key)
        try:
            await self._call(lambda: self._client.eval(_DEBIT_LUA, 1, t_key, tokens, tpm))
        except LimitsUnavailable:
            self.local.debit_now(key, tokens, tpm)

    async def aclose(self) -> None:
        try:
            await self._client.aclose()
        except Exception as exc:  # a paused Redis must not hold shutdown up
            log.warning("closing the rate limit client failed: %r", exc)


def reset_text(seconds: float) -> str:
    """OpenAI's ``x-ratelimit-reset-*`` form: ``1s``, ``6m0s``, ``120ms``, ``1.5s``.

    >>> reset_text(0.12), reset_text(1.5), reset_text(360.0), reset_text(0)
    ('120ms', '1.5s', '6m0s', '0s')
    """
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


__all__ = [
    "Limits",
    "LimitsUnavailable",
    "MemoryLimits",
    "RedisLimits",
    "Verdict",
    "check_gcra",
    "debit_gcra",
    "reset_text",
]
