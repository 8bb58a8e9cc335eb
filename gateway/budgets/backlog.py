"""What Redis has not heard of yet, kept by gateway/budgets/limits.py's ``RedisLimits`` while Redis
cannot answer, and replayed when it answers again (docs/spec.md §20, docs/architecture.md
"Money is a state machine"):

- **unheard reservations**: requests this process admitted per process (a fallback) that are
  still running. Each is *held* in Redis (gateway/budgets/reservations.py's HOLD) before Redis
  admits anything new for this process -- :meth:`Backlog.catch_up` runs ahead of every
  admission while anything is unheard -- so a budget Redis checks includes them: a replica
  cannot spend a budget twice across an outage;
- **settlements Redis did not confirm** (the ledger): replayed in order, each at most once.

Every entry is one script call keyed by the request's id, so a replay of something Redis ran
already (it timed out here, ran late there) does nothing. A request's id is in at most one of
the two: its settlement replaces its hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from gateway.store.guard import RedisGuard, RedisUnavailable

if TYPE_CHECKING:
    from gateway.budgets.limits import Allowance

log = logging.getLogger("gateway.auth")

#: seconds between two replays while Redis does not confirm them
RETRY_S: Final = 1.0

#: one script call Redis has not confirmed: (allowance, keys, args, cost spent by it)
Entry = tuple["Allowance", tuple[bytes, ...], tuple[bytes, ...], int]
Script = Callable[[tuple[bytes, ...], tuple[bytes, ...]], Awaitable[Any]]


class Backlog:
    """The unheard reservations and the ledger of one ``RedisLimits``.

    ``observe(a, reply)`` is told each settlement's reply (what Redis says was spent);
    ``leased(a, rid, reply)`` each hold's (the request's reservation now has a lease there)."""

    def __init__(
        self,
        guard: RedisGuard,
        settle: Script,
        hold: Script,
        observe: Callable[[Allowance, bytes], None],
        leased: Callable[[Allowance, str, bytes], None],
    ) -> None:
        self._guard = guard
        self._settle, self._hold = settle, hold
        self._observe, self._leased = observe, leased
        #: request id -> its hold, for a request admitted here that Redis has not heard of
        self.unheard: dict[str, Entry] = {}
        #: request id -> its settlement, not confirmed by Redis
        self.ledger: dict[str, Entry] = {}
        #: budget id -> the spending in the ledger (what Redis has not heard of)
        self.owed: dict[str, int] = {}
        #: replays that failed (a caller that waited for one that failed does not try again)
        self._failures = 0
        self._replaying = asyncio.Lock()
        self._retrying: asyncio.Task[None] | None = None

    @property
    def behind(self) -> bool:
        """Redis has not heard of everything this process counted."""
        return bool(self.unheard or self.ledger)

    def reserved_here(
        self, a: Allowance, rid: str, keys: tuple[bytes, ...], args: tuple[bytes, ...]
    ) -> None:
        """A request admitted per process: held in Redis as soon as it answers."""
        self.unheard[rid] = (a, keys, args, 0)
        self._wake()

    def owe(
        self, a: Allowance, rid: str, keys: tuple[bytes, ...], args: tuple[bytes, ...], cost: int
    ) -> None:
        """A settlement Redis did not confirm: replayed (at most once) when it answers. It
        replaces the request's hold: a settlement with no record spends, as a settled hold."""
        self.unheard.pop(rid, None)
        self.ledger[rid] = (a, keys, args, cost)
        for b in a.budgets:
            self.owed[b.id] = self.owed.get(b.id, 0) + cost
        self._wake()

    def settled(self, rid: str) -> None:
        """The request's settlement reached Redis: its hold is no longer needed."""
        self.unheard.pop(rid, None)

    def _wake(self) -> None:
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.get_running_loop().create_task(self._retry())

    async def _retry(self) -> None:
        """While anything is unheard, replay it every :data:`RETRY_S` (the breaker decides
        whether a try reaches Redis): it never waits for more traffic."""
        while self.behind:
            await asyncio.sleep(RETRY_S)
            await self.flush()

    async def flush(self) -> None:
        """Replay everything, oldest first, while Redis answers (one replay at a time)."""
        async with self._replaying:
            await self._replay()

    async def catch_up(self) -> bool:
        """Replay everything before an admission in Redis; False: Redis has not heard it all
        (the admission is then counted here). Callers that waited for a replay that failed
        do not try again: one timeout per outage, not one per waiting request."""
        failures = self._failures
        async with self._replaying:
            if self._failures == failures:
                await self._replay()
        return not self.behind

    async def _replay(self) -> None:
        for table, script in ((self.unheard, self._hold), (self.ledger, self._settle)):
            while table:
                rid, (a, keys, args, cost) = next(iter(table.items()))
                try:
                    reply = await self._guard.call(partial(script, keys, args))
                except RedisUnavailable:
                    self._failures += 1
                    return
                if table.pop(rid, None) is None:
                    continue  # settled meanwhile (its settlement is what counts)
                if table is self.unheard:
                    self._leased(a, rid, reply)
                    continue
                for b in a.budgets:
                    self.owed[b.id] -= cost
                self._observe(a, reply)

    async def aclose(self) -> None:
        """A last chance for what Redis missed (bounded: shutdown goes on)."""
        if self._retrying is not None:
            self._retrying.cancel()
        if not self.behind:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self.flush()
        if self.ledger:
            log.error(
                "rate limits: %d settlements Redis did not confirm at shutdown (each may or "
                "may not have run there)",
                len(self.ledger),
            )


__all__ = ["RETRY_S", "Backlog", "Entry"]
