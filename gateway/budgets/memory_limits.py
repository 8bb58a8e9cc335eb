"""The limits counted in this process (docs/spec.md §12, §20): the store when no Redis is
configured, and the one a Redis store stands in with while Redis cannot answer.

The buckets run on ``time.monotonic``, the budgets' calendar periods and the reservations' leases
on the wall clock. The reservations follow gateway/budgets/reservations.py's table
(:func:`gateway.budgets.reservations.step`), as the Redis scripts do; the state is bounded (one
entry per configured key, limit and budget, and one record per request in flight).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Final

from gateway.budgets.limits import (
    Allowance,
    Budget,
    Spent,
    Verdict,
    budget_refusal,
    check_gcra,
    debit_gcra,
    new_rid,
)
from gateway.budgets.reservations import ADMIT, EXPIRE, HOLD, RESERVED, SETTLE, SETTLED, step
from gateway.budgets.spend import current_period
from gateway.memo import remember

#: per-process state is bounded: one entry per configured key, limit and budget
_MEMORY_MAX: Final = 100_000
#: the end of a period that never ends ("total")
_NEVER: Final = 1 << 62


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

    def settle_now(self, a: Allowance, spent: Spent) -> bool:
        record = self._records.pop(spent.rid, None) if spent.rid else None
        settled = spent.rid in self._settled
        state_was = record[0] if record is not None else (SETTLED if settled else None)
        new, release, spend, _ = step(state_was, SETTLE)
        if not (release or spend):
            return True  # settled before: at most once
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
        return True

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


__all__ = ["MemoryLimits"]
