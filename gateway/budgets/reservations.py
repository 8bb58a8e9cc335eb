"""One reservation per request: its states and the table of their transitions (docs/spec.md
§20, docs/architecture.md "Money is a state machine").

A model call of a key with a budget reserves its worst case before it goes upstream, under an id
of its own (``rid``). The reservation is one record, in one of three states, and every operation
on it is a row of :data:`TRANSITIONS` -- the way h11 keeps a connection's states in one table::

    (none) ──admit, hold──► RESERVED ──settle──► SETTLED ◄──settle── (none)
                               │                    ▲
                             expire               settle
                               └────► EXPIRED ──────┘

- *admit* reserves the cost against each of the request's budgets, in the period it was made;
- *hold* reserves it without checking anything: the request was admitted by a replica that
  counted it per process while Redis could not answer, and it is still running. When Redis
  answers again that replica holds each such request there before Redis admits anything new
  for it, so the request's reservation is in the budget Redis checks (money fails closed).
  A hold that finds a record (the admission ran late in Redis, or the request is settled
  already) does nothing;
- *settle* releases the reservation (if it has not expired) and spends the real cost, once:
  a second settle of the same id -- a retry after a timeout, a replay from the fallback ledger
  -- finds SETTLED and does nothing; an admission that arrives after its settlement (it was
  sent, timed out, and Redis ran it late) finds SETTLED and reserves nothing;
- *expire*: a reservation whose lease ran out (its replica died: live replicas renew theirs
  every third of :data:`RESERVE_TTL_S`) is released by the next script that touches the budget;
  its settlement, should it still come, spends without releasing again.

A settle with no record (the admission was refused, or counted per process while Redis was
away) spends in the current period. The spending of a request admitted in one period and
settled in the next is booked to the period it was admitted in; the new period's budget starts
with nothing reserved.

The per-process :class:`gateway.budgets.memory_limits.MemoryLimits` keeps the same records and
applies the same table (:func:`step`); the scripts of gateway/budgets/scripts.py are that table
written for Redis, and tests/budgets/test_reservations.py runs random sequences of operations
against both and compares.
"""

from __future__ import annotations

from typing import Final

RESERVED: Final = "r"
SETTLED: Final = "s"
EXPIRED: Final = "x"
ADMIT: Final = "admit"
HOLD: Final = "hold"
SETTLE: Final = "settle"
EXPIRE: Final = "expire"

#: (state, event) -> (new state, release the reservation, spend, reserve)
TRANSITIONS: Final[dict[tuple[str | None, str], tuple[str, bool, bool, bool]]] = {
    (None, ADMIT): (RESERVED, False, False, True),
    (RESERVED, ADMIT): (RESERVED, False, False, False),
    (EXPIRED, ADMIT): (EXPIRED, False, False, False),
    (SETTLED, ADMIT): (SETTLED, False, False, False),
    (None, HOLD): (RESERVED, False, False, True),
    (RESERVED, HOLD): (RESERVED, False, False, False),
    (EXPIRED, HOLD): (EXPIRED, False, False, False),
    (SETTLED, HOLD): (SETTLED, False, False, False),
    (None, SETTLE): (SETTLED, False, True, False),
    (RESERVED, SETTLE): (SETTLED, True, True, False),
    (EXPIRED, SETTLE): (SETTLED, False, True, False),
    (SETTLED, SETTLE): (SETTLED, False, False, False),
    (RESERVED, EXPIRE): (EXPIRED, True, False, False),
}


def step(state: str | None, event: str) -> tuple[str, bool, bool, bool]:
    """The row of :data:`TRANSITIONS` for ``event`` in ``state``.

    >>> step(None, ADMIT)
    ('r', False, False, True)
    >>> step(SETTLED, SETTLE)   # a replayed settlement: nothing more
    ('s', False, False, False)
    """
    return TRANSITIONS[(state, event)]


#: a reservation's lease: one not renewed for this long is released (its replica died)
RESERVE_TTL_S: Final = 60
#: how long an admitted request's record is kept (its request may stream that long)
RECORD_TTL_S: Final = 2 * 86400
#: how long a settled request's record is kept, so a late replay of it is recognised: replays
#: follow Redis's return within seconds (the ledger retries every second)
SETTLED_TTL_S: Final = 3600


def member(rid: str, cost: int, start: int) -> str:
    """A reservation's entry in a budget's sorted set (scored by its expiry): the request's
    id, its cost and the period it was made in, so the scripts can release it from its entry
    alone."""
    return f"{rid}|{cost}|{start}"


__all__ = [
    "ADMIT",
    "EXPIRE",
    "EXPIRED",
    "HOLD",
    "RECORD_TTL_S",
    "RESERVED",
    "RESERVE_TTL_S",
    "SETTLE",
    "SETTLED",
    "SETTLED_TTL_S",
    "TRANSITIONS",
    "member",
    "step",
]
