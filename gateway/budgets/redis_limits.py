"""The limits in Redis, shared by the replicas (docs/spec.md §12, §20).

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
import time
from functools import partial
from typing import Final

from gateway.budgets.backlog import Backlog
from gateway.budgets.limits import (
    LEASES,
    Allowance,
    Budget,
    Spent,
    Verdict,
    budget_refusal,
    new_rid,
)
from gateway.budgets.memory_limits import MemoryLimits
from gateway.budgets.reservations import RECORD_TTL_S, RESERVE_TTL_S, SETTLED_TTL_S, member
from gateway.budgets.scripts import ADMIT_LUA, HOLD_LUA, RENEW_LUA, REPORT_LUA, SETTLE_LUA
from gateway.budgets.spend import period_bounds
from gateway.store.breaker import CircuitBreaker
from gateway.store.guard import GuardedRedis, RedisUnavailable

log = logging.getLogger("gateway.auth")

_REC: Final = b"%d" % RECORD_TTL_S
_SETTLED: Final = b"%d" % SETTLED_TTL_S


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


class RedisLimits(GuardedRedis):
    """The buckets and budgets in Redis (standalone or Cluster: every key a script touches
    shares one hash tag), with the per-process :class:`MemoryLimits` standing in while Redis
    is unreachable.

    What Redis did not hear of meanwhile waits in a :class:`Backlog` and is replayed as soon as
    Redis answers again: the requests admitted here that still run are held there before Redis
    admits anything new, and the settlements it did not confirm are replayed in order; the
    scripts apply each request at most once, so a settlement that timed out but ran is not
    applied twice. A live request's reservation is renewed every third of its lease, so only a
    dead replica's expire."""

    error = LimitsUnavailable
    what = "rate limit"
    log = log

    def __init__(
        self,
        url: str,
        timeout_ms: float,
        password: str | None = None,
        cluster: bool = False,
        breaker: CircuitBreaker | None = None,
        reserve_ttl_s: int = RESERVE_TTL_S,
    ) -> None:
        super().__init__(
            url, timeout_ms / 1000.0, password=password, cluster=cluster, breaker=breaker
        )
        # EVALSHA: the scripts' text goes to Redis once (again after a restart), not per call
        self._admit = self.client.register_script(ADMIT_LUA)
        self._settle = self.client.register_script(SETTLE_LUA)
        self._renew = self.client.register_script(RENEW_LUA)
        self._report = self.client.register_script(REPORT_LUA)
        hold = self.client.register_script(HOLD_LUA)
        self._backlog = Backlog(self.guard, self._settle, hold, self._observe, self._held)
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

    def admit_now(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> None:
        """Redis decides: await :meth:`admit`."""
        return None

    def settle_now(self, a: Allowance, spent: Spent) -> bool:
        """Redis is told: await :meth:`settle`."""
        return False

    async def admit(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> Verdict:
        metered = bool(rid) and bool(tokens or cost)
        if self._backlog.behind and not await self._backlog.catch_up():
            # Redis has not heard of every request admitted here: it cannot decide alone
            return self._here(a, tokens, cost, rid, metered, False)
        args = (self._ttl, *a.head, b"%d" % tokens, b"%d" % cost, *a.tail, rid.encode(), _REC)
        try:
            reply = await self.call(lambda: self._admit(self._keys(a, rid), args))
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
                    await self.call(partial(self._renew, a.leases, (self._ttl, *members)))
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
            reply = await self.call(lambda: self._settle(keys, args))
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
            replies = await self.call(
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
        await super().aclose()


__all__ = ["LimitsUnavailable", "RedisLimits"]
