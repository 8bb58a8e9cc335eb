"""Per-key limits: requests and tokens per minute, and spend budgets, shared by replicas
(docs/spec.md §12, §20).

``rpm`` and ``tpm`` are GCRA (the generic cell rate algorithm: a token bucket kept as one
timestamp, the *theoretical arrival time* ``tat``). A key with ``rpm = N`` may send N requests at
once, then one every 60/N s; its bucket is full again 60 s after it stops. ``tpm`` works the same
way in tokens, but a request's tokens are known only when its answer is, so the request
*reserves* its worst case before it goes upstream (its estimate, at most the whole ``tpm``:
:func:`gateway.budgets.spend.estimate`) and the end of the request replaces the reservation with the
usage the upstream reported. Concurrent requests therefore cannot overdraw the bucket beyond the
estimate's error::

    used  = max(tat - now, 0)            # seconds of the 60 s window already spent
    rpm:  admit iff used + 60/rpm <= 60;                 then tat = max(tat, now) + 60/rpm
    tpm:  admit iff used < 60 and used + r * 60/tpm <= 60; then tat = max(tat, now) + r * 60/tpm
          at the end                                       tat += (tokens - r) * 60/tpm

Budgets (``budget_usd`` of a key, and of its ``[[auth.tenants]]`` entry: both are checked) count
whole nano-dollars per UTC period (:func:`gateway.budgets.spend.period_bounds`): *spent* this
period and *reserved* by requests in flight. A request reserving ``c`` is admitted iff ``spent +
reserved + c <= budget`` for each budget; at its end its reservation is released and its real
cost spent.
Each request's reservation is a record of its own, under an id of its own, with the states and
transitions of gateway/budgets/reservations.py: settled at most once, released when its lease
runs out (the replica that made it died; live ones renew theirs), never a whole budget's sum.

With Redis (``auth.redis_url``, or the ``[cache]`` Redis) the admission of a request — budgets,
tokens and requests — is **one** Lua script, one round trip, atomic, on Redis's own clock
(``TIME``), so replicas with skewed clocks share one budget; the end of the request is one more
script. Both are keyed by the request's reservation id, so a retry or a replay is applied at
most once. A key's buckets and budgets and its tenant's budget share one hash tag (the tenant),
so the scripts run on Redis Cluster too. Each call goes through the one Redis guard
(gateway/store/guard.py: ``auth.timeout_ms``, a circuit breaker, and the rule that a command
that timed out may have run). While Redis is unreachable the limits are counted here, per
process (never unlimited, never a wait): a budget's spending starts from what Redis last said
was spent, so each replica can spend at most what was left of it then; the settlements Redis
did not confirm wait in a ledger and are replayed when it answers again (nothing is forgotten,
nothing counted twice), and the requests admitted here meanwhile that still run are held there
before Redis admits anything new from this process (gateway/budgets/backlog.py: money fails
closed when Redis returns). ``gateway_ratelimit_fallback`` is 1 and a warning is logged while that
lasts; the first command that succeeds again ends the fallback (and logs it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Protocol

from gateway.budgets.backlog import Backlog
from gateway.budgets.reservations import (
    ADMIT,
    ADMIT_LUA,
    EXPIRE,
    HOLD,
    HOLD_LUA,
    RECORD_TTL_S,
    RENEW_LUA,
    REPORT_LUA,
    RESERVE_TTL_S,
    RESERVED,
    SETTLE,
    SETTLE_LUA,
    SETTLED,
    SETTLED_TTL_S,
    member,
    step,
)
from gateway.budgets.spend import PERIOD_CODES, current_period, nano, period_bounds
from gateway.memo import remember
from gateway.store.breaker import CircuitBreaker
from gateway.store.connect import connect
from gateway.store.guard import RedisGuard, RedisUnavailable, close_quietly

log = logging.getLogger("gateway.auth")

WINDOW_S: Final = 60.0
#: a budget's sorted set of reservations (by lease expiry) is named after it with this suffix
LEASES: Final = ":leases"
_REC: Final = b"%d" % RECORD_TTL_S
_SETTLED: Final = b"%d" % SETTLED_TTL_S
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
        "codes",
        "head",
        "id",
        "kb_key",
        "key_budget",
        "leases",
        "r_key",
        "record_prefix",
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
        # the scripts' keys and constant arguments, encoded once (per request only the tokens,
        # the cost and the request's record are): KEYS = the buckets, the budgets, their
        # leases, then the record; ARGV = lease ttl, head, tokens, cost, tail, id, record ttl
        keys = (self.r_key, self.t_key, self.kb_key, self.tb_key, *self._lease_names())
        self.script_keys = tuple(k.encode() for k in keys)
        #: the budgets' sets of reservations, in the order of ``budgets``
        self.leases = tuple((b.id + LEASES).encode() for b in self.budgets)
        self.record_prefix = "gateway:reservation:v1:{" + tag + "}:"
        self.head = (b"%d" % (rpm or 0), b"%d" % (tpm or 0))
        limits = (*_budget_args(key_budget), *_budget_args(tenant_budget))
        self.tail = tuple(b"%d" % v for v in limits)
        #: the budgets' period codes (-1: no such budget), as the settle and hold scripts take them
        self.codes = (self.tail[1], self.tail[3])

    def _lease_names(self) -> tuple[str, str]:
        return self.kb_key + LEASES, self.tb_key + LEASES


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

    async def admit(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> Verdict:
        """Check every limit of ``a`` and, when all admit, reserve ``tokens`` and ``cost``
        under the request's id ``rid`` (at most once per id)."""
        ...

    async def settle(self, a: Allowance, spent: Spent) -> None:
        """Replace a request's reservation with what it really used (at most once per id)."""
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
    #: the request's reservation id ('' : it reserved nothing; its settlement gets one)
    rid: str = ""


def new_rid() -> str:
    """A reservation's id: unique per request, whatever id the client sent."""
    return os.urandom(12).hex()


class _State:
    """A budget in this process: this period's spent and reserved, the previous period's
    spent, and the live reservations (request id -> cost, period made in, expiry), oldest
    lease first."""

    __slots__ = ("end", "held", "pspent", "pstart", "reserved", "spent", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.spent = self.reserved = self.pspent = 0
        self.pstart = -1
        self.held: dict[str, tuple[int, int, float]] = {}


class MemoryLimits:
    """The buckets and budgets in this process (``time.monotonic`` for the buckets, the wall
    clock for the budgets' calendar periods and the reservations' leases). The reservations
    follow gateway/budgets/reservations.py's table (:func:`step`), as the Redis scripts do."""

    #: the state is here: never a fallback
    fallback = False

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        reserve_ttl_s: float = math.inf,
    ) -> None:
        # In one process every reservation's owner is alive for as long as the store is: its
        # lease never runs out (a finite ``reserve_ttl_s`` is the shared store's rule, which
        # the tests apply to this store too).
        self._clock = clock
        self._wall = wall
        self.reserve_ttl_s = reserve_ttl_s
        self._tat: dict[str, float] = {}
        self._spend: dict[str, _State] = {}
        #: request id -> [state, cost, tokens, {budget id: period start}]
        self._records: dict[str, list[Any]] = {}
        #: ids settled lately (bounded), so a replay or a late admission does nothing; live
        #: records are never evicted (there are as many as requests in flight)
        self._settled: dict[str, bool] = {}

    def _budget(self, b: Budget, now: float) -> _State:
        """The budget's state in the current period, its expired leases released (EXPIRE)."""
        now_s = int(now)
        state = self._spend.get(b.id)
        if state is None or not state.start <= now_s < state.end:
            start, reset = current_period(b.code, now_s)
            if state is None:
                state = remember(self._spend, b.id, _State(start, reset or _NEVER), _MEMORY_MAX)
            elif state.start != start:
                state.pstart, state.pspent = state.start, state.spent
                state.spent = state.reserved = 0
            state.start, state.end = start, reset or _NEVER
        held = state.held
        while held:
            rid, (cost, made, expiry) = next(iter(held.items()))
            if expiry > now:
                break
            del held[rid]
            if made == state.start:
                state.reserved -= cost
            record = self._records.get(rid)
            if record is not None and record[0] == RESERVED:
                record[0] = step(RESERVED, EXPIRE)[0]
        return state

    def admit_now(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> Verdict:
        if rid and (rid in self._records or rid in self._settled):  # admitted or settled before
            step(self._records[rid][0] if rid in self._records else SETTLED, ADMIT)
            return Verdict(True)
        left: int | None = None
        states = []
        now = 0.0
        if a.budgets:
            now = self._wall()
            for b in a.budgets:
                state = self._budget(b, now)
                room = b.limit - state.spent - state.reserved
                if cost > room:
                    reset = 0 if state.end == _NEVER else state.end
                    refused = budget_refusal(b, state.spent, state.reserved, cost, reset, int(now))
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
        self._reserve(a, rid, tokens, cost, states, now)
        return verdict

    def _reserve(
        self, a: Allowance, rid: str, tokens: int, cost: int, states: list[_State], now: float
    ) -> None:
        if not (cost or tokens):
            return
        rid = rid or new_rid()
        made = {}
        expiry = now + self.reserve_ttl_s
        for b, state in zip(a.budgets, states, strict=True):
            made[b.id] = state.start
            if cost:
                state.reserved += cost
                state.held[rid] = (cost, state.start, expiry)
        record = [step(None, ADMIT)[0], cost, tokens, made]
        self._records[rid] = record

    def hold(self, a: Allowance, rid: str, cost: int, tokens: int = 0) -> None:
        """Count a reservation made elsewhere, unchecked, at most once per id (HOLD, the
        operation Redis applies to the requests a fallback admitted: gateway/budgets/backlog.py).
        Here: the shared store's admission of this process's request, so a fallback starts
        with it in flight."""
        if rid in self._records or rid in self._settled:
            step(self._records[rid][0] if rid in self._records else SETTLED, HOLD)
            return
        tat = debit_gcra(self._clock(), self._tat.get(a.t_key), tokens, a.tpm) if a.tpm else None
        if tat is not None and tokens:
            remember(self._tat, a.t_key, tat, _MEMORY_MAX)
        now = self._wall()
        states = [self._budget(b, now) for b in a.budgets] if cost else []
        self._reserve(a, rid, tokens, cost, states, now)

    def renew(self, rid: str) -> None:
        """Extend a live request's lease (its oldest-first place moves to the end)."""
        record = self._records.get(rid)
        if record is None or record[0] != RESERVED:
            return
        expiry = self._wall() + self.reserve_ttl_s
        for budget_id in record[3]:
            state = self._spend.get(budget_id)
            entry = state.held.pop(rid, None) if state is not None else None
            if state is not None and entry is not None:
                state.held[rid] = (entry[0], entry[1], expiry)

    def made_in(self, rid: str) -> dict[str, int] | None:
        """The period each budget of a live request was admitted in (None: no such request)."""
        record = self._records.get(rid)
        return dict(record[3]) if record is not None else None

    def settle_now(self, a: Allowance, spent: Spent) -> None:
        record = self._records.pop(spent.rid, None) if spent.rid else None
        settled = spent.rid in self._settled
        state_was = record[0] if record is not None else (SETTLED if settled else None)
        new, release, spend, _ = step(state_was, SETTLE)
        if not (release or spend):
            return  # settled before: at most once
        held_tokens = record[2] if record is not None else 0
        delta = spent.tokens - held_tokens
        if a.tpm and delta:
            tat = debit_gcra(self._clock(), self._tat.get(a.t_key), delta, a.tpm)
            if tat is None:
                self._tat.pop(a.t_key, None)
            else:
                remember(self._tat, a.t_key, tat, _MEMORY_MAX)
        if a.budgets:
            now = self._wall()
            for b in a.budgets:
                state = self._budget(b, now)
                made = record[3].get(b.id, state.start) if record is not None else state.start
                entry = state.held.pop(spent.rid, None)  # (an expired lease is gone already)
                if entry is not None and made == state.start:
                    state.reserved -= entry[0]
                if made == state.pstart and made != state.start:
                    state.pspent += spent.cost
                else:
                    state.spent += spent.cost
        if spent.rid:  # a late admission of it reserves nothing (as the scripts' record)
            remember(self._settled, spent.rid, new == SETTLED, _MEMORY_MAX)

    def observe(self, b: Budget, start: int, spent: int) -> None:
        """What the shared store says a budget has spent (where a fallback starts from)."""
        state = self._budget(b, self._wall())
        if state.start == start:  # (a reply from another period is of no use here)
            state.spent = spent

    def view(self, budget: Budget) -> tuple[int, int, int, int]:
        state = self._budget(budget, self._wall())
        reset = 0 if state.end == _NEVER else state.end
        return state.start, state.spent, max(state.reserved, 0), reset

    async def admit(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> Verdict:
        return self.admit_now(a, tokens, cost, rid)

    async def settle(self, a: Allowance, spent: Spent) -> None:
        self.settle_now(a, spent)

    async def report(self, budgets: list[Budget]) -> tuple[list[tuple[int, int, int, int]], bool]:
        return [self.view(b) for b in budgets], False

    async def aclose(self) -> None:
        """Nothing to release."""


class LimitsUnavailable(RedisUnavailable):
    """Redis could not answer within the bound (or the breaker is open)."""


def _shared_verdict(
    local: MemoryLimits, owed: dict[str, int], a: Allowance, cost: int, r: list[int]
) -> Verdict:
    """The admission script's reply as a verdict (and what it says each budget has spent,
    told to the per-process store a fallback starts from)."""
    allowed, retry_us, rem_r, rem_t, reset_r, reset_t, by, now_s = r[:8]
    left: int | None = None
    for b, (start, spent, reserved) in ((a.key_budget, r[8:11]), (a.tenant_budget, r[11:14])):
        if b is None:
            continue
        local.observe(b, start, spent + owed.get(b.id, 0))
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


def _budget_periods(a: Allowance, made: dict[str, int] | None) -> tuple[bytes, bytes]:
    """The period each budget's request was admitted in here (-1: unknown), for a request
    Redis has no record of: its cost is booked there, as this process books it."""
    made = made or {}
    key, tenant = a.key_budget, a.tenant_budget
    return (
        b"%d" % made.get(key.id, -1) if key is not None else b"-1",
        b"%d" % made.get(tenant.id, -1) if tenant is not None else b"-1",
    )


class RedisLimits:
    """The buckets and budgets in Redis (standalone or Cluster: every key a script touches
    shares one hash tag), with the per-process :class:`MemoryLimits` standing in while Redis
    is unreachable.

    What Redis did not hear of meanwhile waits in a :class:`Backlog` and is replayed as soon as
    Redis answers again: the requests admitted here that still run are held there before Redis
    admits anything new, and the settlements it did not confirm are replayed in order; the
    scripts apply each request at most once, so a settlement that timed out but ran is not
    applied twice. A live request's reservation is renewed every third of its lease, so only a
    dead replica's expire."""

    def __init__(
        self,
        url: str,
        timeout_ms: float,
        password: str | None = None,
        cluster: bool = False,
        breaker: CircuitBreaker | None = None,
        reserve_ttl_s: int = RESERVE_TTL_S,
    ) -> None:
        self._client = connect(url, timeout_ms / 1000.0, password=password, cluster=cluster)
        # EVALSHA: the scripts' text goes to Redis once (again after a restart), not per call
        self._admit = self._client.register_script(ADMIT_LUA)
        self._settle = self._client.register_script(SETTLE_LUA)
        self._renew = self._client.register_script(RENEW_LUA)
        self._report = self._client.register_script(REPORT_LUA)
        self._guard = RedisGuard(
            breaker or CircuitBreaker(_BREAKER_FAILURES, _BREAKER_RESET_S),
            timeout_ms / 1000.0,
            LimitsUnavailable,
            self._down,
            self._up,
        )
        hold = self._client.register_script(HOLD_LUA)
        self._backlog = Backlog(self._guard, self._settle, hold, self._observe, self._held)
        self._ttl = b"%d" % reserve_ttl_s
        self.reserve_ttl_s = reserve_ttl_s
        self.local = MemoryLimits()
        #: request id -> (allowance, members) of reservations held in Redis (their leases)
        self._live: dict[str, tuple[Allowance, tuple[bytes, ...]]] = {}
        self._renewing: asyncio.Task[None] | None = None
        #: True while limits are counted per process because Redis is unreachable
        self.fallback = False

    def _down(self, exc: Exception) -> None:
        self.fallback = True
        log.warning(
            "rate limits: Redis unreachable (%s); counting limits per process until it is back",
            type(exc).__name__,
        )

    def _up(self) -> None:
        self.fallback = False
        log.warning("rate limits: Redis is back; limits are shared by the replicas again")

    def _keys(self, a: Allowance, rid: str) -> tuple[bytes, ...]:
        return (*a.script_keys, (a.record_prefix + rid).encode())

    async def admit(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> Verdict:
        metered = bool(rid) and bool(tokens or cost)
        if self._backlog.behind and not await self._backlog.catch_up():
            # Redis has not heard of every request admitted here: it cannot decide alone
            return self._here(a, tokens, cost, rid, metered, False)
        args = (self._ttl, *a.head, b"%d" % tokens, b"%d" % cost, *a.tail, rid.encode(), _REC)
        try:
            reply = await self._guard.call(lambda: self._admit(self._keys(a, rid), args))
        except asyncio.CancelledError:
            if metered:  # it may have run: its release waits in the ledger
                self._owe(a, rid, Spent(0, 0, 0, 0, rid=rid))
            raise
        except LimitsUnavailable as exc:
            return self._here(a, tokens, cost, rid, metered, exc.maybe_ran)
        r = [int(x) for x in reply.split()]
        verdict = _shared_verdict(self.local, self._backlog.owed, a, cost, r)
        if verdict.allowed and metered:
            self.local.hold(a, rid, cost)
            if cost and not r[14]:
                self._lease(a, rid, cost, (r[8], r[11]))
        return verdict

    def _here(
        self, a: Allowance, tokens: int, cost: int, rid: str, metered: bool, maybe_ran: bool
    ) -> Verdict:
        """The admission counted in this process. One admitted is held in Redis when it
        answers again (before Redis admits anything new); one refused whose script may have
        run there has its reservation released there."""
        verdict = self.local.admit_now(a, tokens, cost, rid)
        if metered and verdict.allowed:
            args = self._hold_args(a, rid, tokens, cost, self.local.made_in(rid))
            self._backlog.reserved_here(a, rid, self._keys(a, rid), args)
        elif metered and maybe_ran:
            self._owe(a, rid, Spent(0, 0, 0, 0, rid=rid))
        return verdict

    def _held(self, a: Allowance, rid: str, reply: bytes) -> None:
        """A request admitted here is held in Redis now: its lease is renewed from here on."""
        _, key_start, tenant_start, cost = (int(x) for x in reply.split())
        if cost:
            self._lease(a, rid, cost, (key_start, tenant_start))

    def _lease(self, a: Allowance, rid: str, cost: int, starts: tuple[int, int]) -> None:
        members = []
        for b, start in zip((a.key_budget, a.tenant_budget), starts, strict=True):
            if b is not None:
                members.append(member(rid, cost, start).encode())
        self._live[rid] = (a, tuple(members))
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Every third of the lease, renew the reservations of the requests still running."""
        while self._live:
            await asyncio.sleep(self.reserve_ttl_s / 3)
            for rid, (a, members) in list(self._live.items()):
                if rid not in self._live:
                    continue
                try:
                    await self._guard.call(partial(self._renew, a.leases, (self._ttl, *members)))
                except LimitsUnavailable:
                    break  # Redis away: the next round tries again

    def _settle_args(
        self, a: Allowance, rid: str, spent: Spent, made: dict[str, int] | None = None
    ) -> tuple[bytes, ...]:
        return (self._ttl, a.head[1], b"%d" % spent.tokens, b"%d" % spent.cost, *a.codes,
                rid.encode(), _SETTLED, *_budget_periods(a, made))  # fmt: skip

    def _owe(
        self, a: Allowance, rid: str, spent: Spent, made: dict[str, int] | None = None
    ) -> None:
        """Keep a settlement Redis did not confirm, to replay (at most once) when it answers."""
        args = self._settle_args(a, rid, spent, made)
        self._backlog.owe(a, rid, self._keys(a, rid), args, spent.cost)

    def _hold_args(
        self, a: Allowance, rid: str, tokens: int, cost: int, made: dict[str, int] | None
    ) -> tuple[bytes, ...]:
        return (self._ttl, a.head[1], b"%d" % tokens, b"%d" % cost, *a.codes, rid.encode(),
                _REC, *_budget_periods(a, made))  # fmt: skip

    async def hold(self, a: Allowance, rid: str, tokens: int, cost: int) -> None:
        """Count in Redis a reservation made here (HOLD: never refused, at most once per id),
        now if Redis answers, else when it does (the operation a fallback's admissions get)."""
        args = self._hold_args(a, rid, tokens, cost, None)
        self._backlog.reserved_here(a, rid, self._keys(a, rid), args)
        await self._backlog.catch_up()

    async def settle(self, a: Allowance, spent: Spent) -> None:
        rid = spent.rid or new_rid()
        self._live.pop(rid, None)
        made = self.local.made_in(rid)
        self.local.settle_now(a, spent)
        if rid in self._backlog.ledger:
            return  # owed already: the replay carries it
        self._backlog.settled(rid)  # a hold Redis has not heard of: this settlement replaces it
        args = self._settle_args(a, rid, spent, made)
        keys = self._keys(a, rid)
        try:
            reply = await self._guard.call(lambda: self._settle(keys, args))
        except LimitsUnavailable:
            self._owe(a, rid, spent, made)
            return
        self._observe(a, reply)
        if self._backlog.behind:  # Redis answers again: what it missed, now (off the request path)
            await self._backlog.flush()

    def _observe(self, a: Allowance, reply: bytes) -> None:
        r = [int(x) for x in reply.split()]
        owed = self._backlog.owed
        for b, start, total in ((a.key_budget, r[1], r[2]), (a.tenant_budget, r[3], r[4])):
            if b is not None:
                self.local.observe(b, start, total + owed.get(b.id, 0))

    @property
    def owed(self) -> int:
        """Settlements waiting in the ledger for Redis."""
        return len(self._backlog.ledger)

    @property
    def unheard(self) -> int:
        """Requests admitted here, still running, that Redis has not heard of."""
        return len(self._backlog.unheard)

    def view(self, budget: Budget) -> tuple[int, int, int, int]:
        return self.local.view(budget)

    async def report(self, budgets: list[Budget]) -> tuple[list[tuple[int, int, int, int]], bool]:
        """Each budget as Redis has it (this process's view when Redis cannot answer)."""
        if self._backlog.behind and not await self._backlog.catch_up():
            return await self.local.report(budgets)
        try:
            replies = await self._guard.call(
                lambda: asyncio.gather(
                    *(
                        self._report(
                            (b.id.encode(), (b.id + LEASES).encode()), (self._ttl, b"%d" % b.code)
                        )
                        for b in budgets
                    )
                )
            )
        except LimitsUnavailable:
            return await self.local.report(budgets)
        now_s = int(time.time())
        out = []
        owed = self._backlog.owed
        for b, reply in zip(budgets, replies, strict=True):
            start, spent, reserved = (int(x) for x in reply.split())
            reset = period_bounds(b.code, now_s)[1]
            out.append((start, spent + owed.get(b.id, 0), reserved, reset))
        return out, True

    async def aclose(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
        await self._backlog.aclose()
        await close_quietly(self._client, log, "rate limit")


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
    "new_rid",
    "reset_text",
    "spend_key",
]
