"""Per-key limits: requests and tokens per minute, and spend budgets, shared by replicas
(docs/spec.md §12, §20).

``rpm`` and ``tpm`` are GCRA (the generic cell rate algorithm: a token bucket kept as one
timestamp, the *theoretical arrival time* ``tat``). A key with ``rpm = N`` may send N requests at
once, then one every 60/N s; its bucket is full again 60 s after it stops. ``tpm`` works the same
way in tokens, but a request's tokens are known only when its answer is, so the request
*reserves* its worst case before it goes upstream (its estimate, at most the whole ``tpm``:
:func:`gateway.spend.estimate`) and the end of the request replaces the reservation with the
usage the upstream reported. Concurrent requests therefore cannot overdraw the bucket beyond the
estimate's error::

    used  = max(tat - now, 0)            # seconds of the 60 s window already spent
    rpm:  admit iff used + 60/rpm <= 60;                 then tat = max(tat, now) + 60/rpm
    tpm:  admit iff used < 60 and used + r * 60/tpm <= 60; then tat = max(tat, now) + r * 60/tpm
          at the end                                       tat += (tokens - r) * 60/tpm

Budgets (``budget_usd`` of a key, and of its ``[[auth.tenants]]`` entry: both are checked) count
whole nano-dollars per UTC period (:func:`gateway.spend.period_bounds`): *spent* this period and
*reserved* by requests in flight. A request reserving ``c`` is admitted iff ``spent + reserved +
c <= budget`` for each budget; at its end its reservation is released and its real cost spent.
A reservation nobody settled for :data:`RESERVE_TTL_S` (its replica died) is dropped.

With Redis (``auth.redis_url``, or the ``[cache]`` Redis) the admission of a request — budgets,
tokens and requests — is **one** Lua script, one round trip, atomic, on Redis's own clock
(``TIME``), so replicas with skewed clocks share one budget; the end of the request is one more
script. A key's buckets and budgets and its tenant's budget share one hash tag (the tenant), so
the scripts run on Redis Cluster too. Each command waits at most ``auth.timeout_ms``; a circuit
breaker stops calling a dead Redis at all. While Redis is unreachable the limits are counted
here, per process (never unlimited, never a wait): a budget's spending starts from what Redis
last said was spent, so each replica can spend at most what was left of it then; what was spent
meanwhile is added to Redis when it answers again (nothing is forgotten).
``gateway_ratelimit_fallback`` is 1 and a warning is logged while that lasts; the first command
that succeeds again ends the fallback (and logs it).
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
from gateway.spend import PERIOD_CODES, current_period, nano, period_bounds

log = logging.getLogger("gateway.auth")

WINDOW_S: Final = 60.0
#: a reservation not settled for this long is dropped (the replica that made it is gone)
RESERVE_TTL_S: Final = 900
#: seconds a request refused only because of other requests' reservations is told to wait
IN_FLIGHT_RETRY_S: Final = 1.0
#: breaker for the limiter's Redis (as the cache's defaults)
_BREAKER_FAILURES: Final = 3
_BREAKER_RESET_S: Final = 5.0
#: per-process state is bounded: one entry per configured key, limit and budget
_MEMORY_MAX: Final = 100_000
#: the end of a period that never ends ("total")
_NEVER: Final = 1 << 62


class Budget:
    """One configured budget: a key's or a tenant's (docs/spec.md §20)."""

    __slots__ = ("code", "id", "label", "limit", "period", "usd")

    def __init__(self, budget_id: str, label: str, usd: float, period: str) -> None:
        #: its name in the shared store
        self.id = budget_id
        #: how messages and the spend API name it: "tenant 'team-a'", "key team-a/3f2a9c01b7e4"
        self.label = label
        self.usd = usd
        self.limit = nano(usd)
        self.period = period
        self.code = PERIOD_CODES[period]


def _budget_args(b: Budget | None) -> tuple[int, int]:
    return (b.limit, b.code) if b is not None else (0, -1)


class Allowance:
    """What one key may use, with its names in the shared store (made once per key)."""

    __slots__ = (
        "budgets",
        "head",
        "id",
        "kb_key",
        "key_budget",
        "r_key",
        "rpm",
        "script_keys",
        "t_key",
        "tail",
        "tb_key",
        "tenant_budget",
        "tpm",
    )

    def __init__(
        self,
        limit_id: str,
        tag: str,
        rpm: int | None = None,
        tpm: int | None = None,
        key_budget: Budget | None = None,
        tenant_budget: Budget | None = None,
    ) -> None:
        self.id = limit_id
        self.rpm = rpm
        self.tpm = tpm
        self.key_budget = key_budget
        self.tenant_budget = tenant_budget
        #: the budgets it has, key's first
        self.budgets = tuple(b for b in (key_budget, tenant_budget) if b is not None)
        base = "gateway:ratelimit:v2:{" + tag + "}:" + limit_id
        self.r_key = base + ":r"
        self.t_key = base + ":t"
        # a budget the key does not have is never touched; its name only fills the key list
        self.kb_key = key_budget.id if key_budget is not None else base + ":-"
        self.tb_key = tenant_budget.id if tenant_budget is not None else base + ":-"
        # the admission script's keys and constant arguments, encoded once (per request only
        # the tokens and the cost are): KEYS, then ARGV = head, tokens, cost, tail
        keys = (self.r_key, self.t_key, self.kb_key, self.tb_key)
        self.script_keys = tuple(k.encode() for k in keys)
        self.head = (b"%d" % (rpm or 0), b"%d" % (tpm or 0))
        limits = (*_budget_args(key_budget), *_budget_args(tenant_budget), RESERVE_TTL_S)
        self.tail = tuple(b"%d" % v for v in limits)


def spend_key(tag: str, owner: str) -> str:
    """The shared store's name of a budget (same hash tag as the key's buckets)."""
    return "gateway:spend:v1:{" + tag + "}:" + owner


@dataclass(slots=True)  # not frozen: one is made per request, and frozen init is slow
class Verdict:
    """One admission's outcome, with what the ``x-ratelimit-*`` headers say (OpenAI's names)."""

    allowed: bool
    #: seconds until a refused request would be admitted (0 when allowed or never)
    retry_after_s: float = 0.0
    #: which limit refused: "requests" | "tokens" | "budget" | None
    refused_by: str | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    #: seconds until the bucket is full again
    reset_requests_s: float = 0.0
    reset_tokens_s: float = 0.0
    #: nano-USD left of the tighter budget before this request (None: no budget)
    budget_left: int | None = None
    #: the budget that refused, what it had spent, when its period resets (Unix s; 0: never)
    budget: Budget | None = None
    spent: int = 0
    reset_at: int = 0
    #: decided by the shared store (False: in this process)
    shared: bool = False


def check_gcra(
    now: float,
    r_tat: float | None,
    t_tat: float | None,
    rpm: int | None,
    tpm: int | None,
    tokens: int = 0,
) -> tuple[Verdict, float | None, float | None]:
    """The rate check, on plain numbers (the Lua script does the same arithmetic).

    Returns the verdict and the new request and token ``tat`` to store (None: unchanged).

    >>> v, r, _ = check_gcra(100.0, None, None, 2, None)
    >>> v.allowed, v.remaining_requests, r
    (True, 1, 130.0)
    >>> v, r, _ = check_gcra(100.0, 160.0, None, 2, None)
    >>> v.allowed, v.refused_by, v.retry_after_s, r
    (False, 'requests', 30.0, None)
    >>> check_gcra(100.0, None, 161.0, None, 600)[0].refused_by   # 61 s of tokens spent
    'tokens'
    >>> v, _, t = check_gcra(100.0, None, 130.0, None, 600, tokens=300)  # 30 s + 30 s: fits
    >>> v.allowed, v.remaining_tokens, t
    (True, 300, 160.0)
    >>> round(check_gcra(100.0, None, 130.0, None, 600, tokens=301)[0].retry_after_s, 6)
    0.1
    """
    remaining_t = None
    reset_t = 0.0
    new_t = None
    if tpm:
        per_token = WINDOW_S / tpm
        used_t = max((t_tat or now) - now, 0.0)
        remaining_t = max(int((WINDOW_S - used_t) / per_token), 0)
        if used_t >= WINDOW_S or used_t + tokens * per_token > WINDOW_S + 1e-6:
            retry = used_t + max(tokens, 1) * per_token - WINDOW_S
            return Verdict(False, retry, "tokens", None, remaining_t, 0.0, used_t), None, None
        reset_t = used_t
        if tokens:
            new_t = max(t_tat or now, now) + tokens * per_token
    if not rpm:
        return Verdict(True, 0.0, None, None, remaining_t, 0.0, reset_t), None, new_t
    per_request = WINDOW_S / rpm
    new_tat = max(r_tat or now, now) + per_request
    used_r = new_tat - now
    if used_r > WINDOW_S + 1e-6:
        retry = used_r - WINDOW_S
        verdict = Verdict(False, retry, "requests", 0, remaining_t, used_r - per_request, reset_t)
        return verdict, None, None
    remaining_r = int((WINDOW_S - used_r) / per_request + 1e-6)
    return Verdict(True, 0.0, None, remaining_r, remaining_t, used_r, reset_t), new_tat, new_t


def debit_gcra(now: float, t_tat: float | None, tokens: int, tpm: int) -> float | None:
    """The token ``tat`` after ``tokens`` more (or, negative, fewer) were spent (None: the
    bucket is full).

    >>> debit_gcra(100.0, None, 300, 600)
    130.0
    >>> debit_gcra(100.0, 130.0, -100, 600), debit_gcra(100.0, None, -100, 600)
    (120.0, None)
    """
    if tokens >= 0:
        return max(t_tat or now, now) + tokens * (WINDOW_S / tpm)
    return None if t_tat is None else t_tat + tokens * (WINDOW_S / tpm)


def budget_refusal(
    budget: Budget, spent: int, reserved: int, cost: int, reset: int, now_s: float
) -> Verdict | None:
    """The refusal of a request reserving ``cost`` against a budget, or None (it fits).

    One that cannot fit this period whatever else happens waits for the period's reset; one
    that only the reservations in flight keep out is told to retry soon."""
    if spent + reserved + cost <= budget.limit:
        return None
    if spent + cost > budget.limit:
        retry = max(reset - now_s, 1.0) if reset else 0.0
    else:
        retry = IN_FLIGHT_RETRY_S
    left = budget.limit - spent - reserved
    return Verdict(
        False, retry, "budget", budget_left=left, budget=budget, spent=spent, reset_at=reset
    )


class Limits(Protocol):
    """Where the limiter keeps its buckets and budgets (per process, or Redis)."""

    #: True while the limits are counted per process because their shared store is unreachable
    fallback: bool

    async def admit(self, a: Allowance, tokens: int, cost: int) -> Verdict:
        """Check every limit of ``a`` and, when all admit, reserve ``tokens`` and ``cost``."""
        ...

    async def settle(self, a: Allowance, spent: Spent) -> None:
        """Replace a request's reservation with what it really used."""
        ...

    def view(self, budget: Budget) -> tuple[int, int, int, int]:
        """(period start, spent, reserved, reset) as this process last saw them."""
        ...

    async def report(self, budgets: list[Budget]) -> tuple[list[tuple[int, int, int, int]], bool]:
        """Each budget's (start, spent, reserved, reset), and whether from the shared store."""
        ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Spent:
    """One request's reservation and what it really used (tokens, nano-USD)."""

    reserved_tokens: int
    tokens: int
    reserved_cost: int
    cost: int
    #: the reservation was made in the shared store
    shared: bool = False


class MemoryLimits:
    """The buckets and budgets in this process (``time.monotonic`` for the buckets, the wall
    clock for the budgets' calendar periods)."""

    #: the state is here: never a fallback
    fallback = False

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._tat: dict[str, float] = {}
        #: budget id -> [period start, spent, reserved, last touched (s), period end (s)]
        self._spend: dict[str, list[int]] = {}

    def _budget(self, b: Budget, now_s: int) -> list[int]:
        """The budget's state in the current period (spent starts again at 0 in a new one;
        reservations carry over: their requests are still in flight)."""
        state = self._spend.get(b.id)
        if state is None or not state[0] <= now_s < state[4]:
            start, reset = current_period(b.code, now_s)
            if state is None:
                state = remember(self._spend, b.id, [start, 0, 0, now_s, 0], _MEMORY_MAX)
            if state[0] != start:
                state[0], state[1] = start, 0
            state[4] = reset or _NEVER
        elif state[2] and now_s - state[3] > RESERVE_TTL_S:
            state[2] = 0
        return state

    def admit_now(self, a: Allowance, tokens: int, cost: int) -> Verdict:
        left: int | None = None
        states = []
        now_s = 0
        if a.budgets:
            now_s = int(self._wall())
            for b in a.budgets:
                state = self._budget(b, now_s)
                room = b.limit - state[1] - state[2]
                if cost > room:
                    reset = 0 if state[4] == _NEVER else state[4]
                    refused = budget_refusal(b, state[1], state[2], cost, reset, now_s)
                    assert refused is not None
                    return refused
                if left is None or room < left:
                    left = room
                states.append(state)
        if a.rpm or a.tpm:
            verdict, r_tat, t_tat = check_gcra(
                self._clock(), self._tat.get(a.r_key), self._tat.get(a.t_key), a.rpm, a.tpm, tokens
            )
            verdict.budget_left = left
            if not verdict.allowed:
                return verdict
            if r_tat is not None:
                remember(self._tat, a.r_key, r_tat, _MEMORY_MAX)
            if t_tat is not None:
                remember(self._tat, a.t_key, t_tat, _MEMORY_MAX)
        else:
            verdict = Verdict(True, budget_left=left)
        for state in states:
            state[2] += cost
            state[3] = now_s
        return verdict

    def settle_now(self, a: Allowance, spent: Spent) -> None:
        delta = spent.tokens - spent.reserved_tokens
        if a.tpm and delta:
            tat = debit_gcra(self._clock(), self._tat.get(a.t_key), delta, a.tpm)
            if tat is None:
                self._tat.pop(a.t_key, None)
            else:
                remember(self._tat, a.t_key, tat, _MEMORY_MAX)
        if a.budgets and (spent.reserved_cost or spent.cost):
            now_s = int(self._wall())
            for b in a.budgets:
                state = self._budget(b, now_s)
                state[1] += spent.cost
                reserved = state[2] - spent.reserved_cost
                state[2] = reserved if reserved > 0 else 0
                state[3] = now_s

    def hold(self, a: Allowance, cost: int) -> None:
        """Count a reservation the shared store made for this process's request here too: a
        fallback then starts with it in flight."""
        if cost:
            now_s = int(self._wall())
            for b in a.budgets:
                state = self._budget(b, now_s)
                state[2] += cost
                state[3] = now_s

    def observe(self, b: Budget, start: int, spent: int) -> None:
        """What the shared store says a budget has spent (where a fallback starts from)."""
        state = self._budget(b, int(self._wall()))
        if state[0] == start:  # (a reply from another period is of no use here)
            state[1] = spent

    def view(self, budget: Budget) -> tuple[int, int, int, int]:
        state = self._budget(budget, int(self._wall()))
        return state[0], state[1], state[2], 0 if state[4] == _NEVER else state[4]

    async def admit(self, a: Allowance, tokens: int, cost: int) -> Verdict:
        return self.admit_now(a, tokens, cost)

    async def settle(self, a: Allowance, spent: Spent) -> None:
        self.settle_now(a, spent)

    async def report(self, budgets: list[Budget]) -> tuple[list[tuple[int, int, int, int]], bool]:
        return [self.view(b) for b in budgets], False

    async def aclose(self) -> None:
        """Nothing to release."""


# What the two scripts share: UTC calendar periods (the integer arithmetic of
# gateway.spend.period_bounds), and a budget's hash {s: period start, p: spent, r: reserved,
# u: last touched} read into {start, reset, spent, reserved} for the current period. Amounts are
# nano-USD integers (Lua numbers are doubles: exact far beyond these magnitudes).
_PRELUDE: Final = """
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now = now_s * 1000000 + tonumber(t[2])
local window = 60000000
local function from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function bounds(code)
  if code == 0 then return 0, 0 end
  local days = math.floor(now_s / 86400)
  if code == 1 then return days * 86400, (days + 1) * 86400 end
  if code == 2 then
    local monday = days - (days + 3) % 7
    return monday * 86400, (monday + 7) * 86400
  end
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  local start = from_civil(y, m, 1)
  if m == 12 then y, m = y + 1, 1 else m = m + 1 end
  return start * 86400, from_civil(y, m, 1) * 86400
end
local ttl = tonumber(ARGV[9])
local function load(key, code)
  local h = redis.call('HMGET', key, 's', 'p', 'r', 'u')
  local start, reset = bounds(code)
  local spent = tonumber(h[2]) or 0
  local reserved = tonumber(h[3]) or 0
  if tonumber(h[1]) ~= start then spent = 0 end
  if now_s - (tonumber(h[4]) or now_s) > ttl then reserved = 0 end
  return {start, reset, spent, reserved}
end
-- one bulk reply of integers (an array of them costs the client a parsed line each)
local function pack(t)
  local out = {}
  for i, v in ipairs(t) do out[i] = string.format('%.0f', v) end
  return table.concat(out, ' ')
end
local function save(key, b)
  redis.call('HSET', key, 's', b[1], 'p', string.format('%.0f', b[3]),
    'r', string.format('%.0f', math.max(b[4], 0)), 'u', now_s)
  if b[2] > 0 then redis.call('EXPIREAT', key, b[2] + 86400) end
end
"""
# The admission (check_gcra + budget_refusal, then the reservation), atomically. KEYS: requests
# tat, tokens tat, key budget, tenant budget. ARGV: rpm, tpm (0 = none), tokens, cost, key limit,
# key period code (-1 = no budget), tenant limit, tenant period code, reservation ttl (s).
# Returns, space-separated in one string: allowed, retry_us, remaining_requests (-1 none),
# remaining_tokens (-1 none), reset_requests_us, reset_tokens_us, refused_by (0 none,
# 1 requests, 2 tokens, 3 key budget, 4 tenant budget), now_s, key start, spent, reserved,
# tenant start, spent, reserved (the budgets as they were before this request).
_ADMIT_LUA: Final = (
    _PRELUDE
    + """
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local klim, kcode = tonumber(ARGV[5]), tonumber(ARGV[6])
local tlim, tcode = tonumber(ARGV[7]), tonumber(ARGV[8])
local kb, tb = {0, 0, 0, 0}, {0, 0, 0, 0}
local by, retry = 0, 0
if kcode >= 0 then
  kb = load(KEYS[3], kcode)
  if kb[3] + kb[4] + cost > klim then by = 3 end
end
if tcode >= 0 then
  tb = load(KEYS[4], tcode)
  if by == 0 and tb[3] + tb[4] + cost > tlim then by = 4 end
end
local rem_t, reset_t, t_tat, per_t = -1, 0, now, 0
if tpm > 0 then
  per_t = window / tpm
  t_tat = tonumber(redis.call('GET', KEYS[2]) or now)
  local used = math.max(t_tat - now, 0)
  rem_t = math.max(math.floor((window - used) / per_t), 0)
  if by == 0 and (used >= window or used + tokens * per_t > window + 1) then
    by = 2
    retry = math.ceil(used + math.max(tokens, 1) * per_t - window)
  else
    reset_t = math.ceil(used)
  end
end
local rem_r, reset_r, r_new = -1, 0, nil
if rpm > 0 and by == 0 then
  local per = window / rpm
  local tat = tonumber(redis.call('GET', KEYS[1]) or now)
  local new = math.max(tat, now) + per
  local used = new - now
  if used > window + 1 then
    by, retry, rem_r, reset_r = 1, math.ceil(used - window), 0, math.ceil(used - per)
  else
    r_new = new
    rem_r = math.floor((window - used) / per + 0.000001)
    reset_r = math.ceil(used)
  end
end
if by == 0 then
  if r_new then
    redis.call('SET', KEYS[1], string.format('%.0f', r_new), 'PX',
      math.ceil((r_new - now) / 1000) + 1000)
  end
  if tokens > 0 and tpm > 0 then
    local new = math.max(t_tat, now) + tokens * per_t
    redis.call('SET', KEYS[2], string.format('%.0f', new), 'PX',
      math.ceil((new - now) / 1000) + 1000)
  end
  if cost > 0 then
    for i, b in ipairs({{KEYS[3], kb, kcode}, {KEYS[4], tb, tcode}}) do
      if b[3] >= 0 then
        b[2][4] = b[2][4] + cost
        save(b[1], b[2])
        b[2][4] = b[2][4] - cost
      end
    end
  end
end
return pack({by == 0 and 1 or 0, retry, rem_r, rem_t, reset_r, reset_t, by, now_s,
  kb[1], kb[3], kb[4], tb[1], tb[3], tb[4]})
"""
)
# The end of a request: KEYS as for the admission; ARGV: tpm, tokens used - tokens reserved,
# key period code (-1 none), key release, key spend, tenant period code, tenant release,
# tenant spend, reservation ttl. Returns "now_s key_start key_spent tenant_start tenant_spent".
_SETTLE_LUA: Final = (
    _PRELUDE
    + """
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and delta ~= 0 then
  local per = window / tpm
  local cur = redis.call('GET', KEYS[2])
  local new = nil
  if delta > 0 then
    new = math.max(tonumber(cur or now), now) + delta * per
  elseif cur then
    new = tonumber(cur) + delta * per
  end
  if new and new > now then
    redis.call('SET', KEYS[2], string.format('%.0f', new), 'PX',
      math.ceil((new - now) / 1000) + 1000)
  elseif new then
    redis.call('DEL', KEYS[2])
  end
end
local out = {now_s, 0, 0, 0, 0}
for i = 0, 1 do
  local code = tonumber(ARGV[3 + 3 * i])
  if code >= 0 then
    local b = load(KEYS[3 + i], code)
    b[4] = b[4] - tonumber(ARGV[4 + 3 * i])
    b[3] = b[3] + tonumber(ARGV[5 + 3 * i])
    save(KEYS[3 + i], b)
    out[2 + 2 * i], out[3 + 2 * i] = b[1], b[3]
  end
end
return pack(out)
"""
)


class LimitsUnavailable(Exception):
    """Redis could not answer within the bound (or the breaker is open)."""


class RedisLimits:
    """The buckets and budgets in Redis (standalone or Cluster: every key a script touches
    shares one hash tag), with the per-process :class:`MemoryLimits` standing in while Redis
    is unreachable."""

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
        # EVALSHA: the scripts' text goes to Redis once (again after a restart), not per call
        self._admit = self._client.register_script(_ADMIT_LUA)
        self._settle = self._client.register_script(_SETTLE_LUA)
        self._breaker = breaker or CircuitBreaker(_BREAKER_FAILURES, _BREAKER_RESET_S)
        self.local = MemoryLimits()
        #: budget id -> [reservation to release, spending to add] Redis has not been told yet
        self._owed: dict[str, list[int]] = {}
        #: True while limits are counted per process because Redis is unreachable
        self.fallback = False

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

    async def admit(self, a: Allowance, tokens: int, cost: int) -> Verdict:
        args = (*a.head, b"%d" % tokens, b"%d" % cost, *a.tail)
        try:
            reply = await self._call(lambda: self._admit(a.script_keys, args))
        except LimitsUnavailable:
            return self.local.admit_now(a, tokens, cost)
        verdict = self._verdict(a, cost, [int(x) for x in reply.split()])
        if verdict.allowed:
            self.local.hold(a, cost)
        return verdict

    def _verdict(self, a: Allowance, cost: int, r: list[int]) -> Verdict:
        allowed, retry_us, rem_r, rem_t, reset_r, reset_t, by, now_s = r[:8]
        left: int | None = None
        for b, (start, spent, reserved) in ((a.key_budget, r[8:11]), (a.tenant_budget, r[11:14])):
            if b is None:
                continue
            self.local.observe(b, start, spent + self._owed.get(b.id, (0, 0))[1])
            if by in (3, 4) and b is (a.key_budget if by == 3 else a.tenant_budget):
                _, reset = period_bounds(b.code, now_s)
                refused = budget_refusal(b, spent, reserved, cost, reset, now_s)
                assert refused is not None  # the script and budget_refusal agree
                refused.shared = True
                return refused
            room = b.limit - spent - reserved
            left = room if left is None else min(left, room)
        return Verdict(
            allowed == 1,
            retry_us / 1e6,
            (None, "requests", "tokens")[by] if by < 3 else "budget",
            None if rem_r < 0 else rem_r,
            None if rem_t < 0 else rem_t,
            reset_r / 1e6,
            reset_t / 1e6,
            budget_left=left,
            shared=True,
        )

    def _take_owed(self, b: Budget | None, release: int, spend: int) -> tuple[int, int, int]:
        if b is None:
            return -1, 0, 0
        owed = self._owed.pop(b.id, None)
        if owed is not None:
            release, spend = release + owed[0], spend + owed[1]
        return b.code, release, spend

    async def settle(self, a: Allowance, spent: Spent) -> None:
        release = spent.reserved_cost if spent.shared else 0
        # here first (its reservation is held here either way; its tokens were not, when
        # Redis reserved them), so a fallback starts from it; Redis then says what it has
        here = Spent(0, spent.tokens, spent.reserved_cost, spent.cost) if spent.shared else spent
        self.local.settle_now(a, here)
        k = self._take_owed(a.key_budget, release, spent.cost)
        t = self._take_owed(a.tenant_budget, release, spent.cost)
        delta = spent.tokens - (spent.reserved_tokens if spent.shared else 0)
        args = (a.head[1], delta, *k, *t, RESERVE_TTL_S)
        try:
            reply = await self._call(lambda: self._settle(a.script_keys, args))
        except LimitsUnavailable:
            for b, (_, rel, spend) in ((a.key_budget, k), (a.tenant_budget, t)):
                if b is not None:  # told to Redis with the next request's end that gets there
                    owed = self._owed.setdefault(b.id, [0, 0])
                    owed[0] += rel
                    owed[1] += spend
            return
        r = [int(x) for x in reply.split()]
        for b, start, total in ((a.key_budget, r[1], r[2]), (a.tenant_budget, r[3], r[4])):
            if b is not None:
                self.local.observe(b, start, total + self._owed.get(b.id, (0, 0))[1])

    def view(self, budget: Budget) -> tuple[int, int, int, int]:
        return self.local.view(budget)

    async def report(self, budgets: list[Budget]) -> tuple[list[tuple[int, int, int, int]], bool]:
        """Each budget as Redis has it (this process's view when Redis cannot answer)."""
        try:
            rows = await self._call(
                lambda: asyncio.gather(
                    *(self._client.hmget(b.id, ["s", "p", "r", "u"]) for b in budgets)
                )
            )
        except LimitsUnavailable:
            return await self.local.report(budgets)
        now_s = int(time.time())
        out = []
        for b, (s, p, r, u) in zip(budgets, rows, strict=True):
            start, reset = period_bounds(b.code, now_s)
            spent = int(p or 0) if s is not None and int(s) == start else 0
            live = u is not None and now_s - int(u) <= RESERVE_TTL_S
            out.append((start, spent, int(r or 0) if live else 0, reset))
        return out, True

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
    "Allowance",
    "Budget",
    "Limits",
    "LimitsUnavailable",
    "MemoryLimits",
    "RedisLimits",
    "Spent",
    "Verdict",
    "budget_refusal",
    "check_gcra",
    "debit_gcra",
    "reset_text",
    "spend_key",
]
