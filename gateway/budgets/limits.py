"""Per-key limits: requests and tokens per minute, and spend budgets, shared by replicas
(docs/spec.md §12, §20): the arithmetic, and what every store of the limits answers.

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


Two stores answer :class:`Limits`: :class:`gateway.budgets.memory_limits.MemoryLimits` counts in
this process, :class:`gateway.budgets.redis_limits.RedisLimits` in Redis, shared by the replicas
(with the per-process store standing in while Redis cannot answer). The hop that asks them is
gateway/hops/auth.py.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Final, Protocol

from gateway.budgets.spend import PERIOD_CODES, nano

WINDOW_S: Final = 60.0
#: a budget's sorted set of reservations (by lease expiry) is named after it with this suffix
LEASES: Final = ":leases"
#: seconds a request refused only because of other requests' reservations is told to wait
IN_FLIGHT_RETRY_S: Final = 1.0


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

    def admit_now(self, a: Allowance, tokens: int, cost: int, rid: str = "") -> Verdict | None:
        """:meth:`admit` without waiting, when the store decides in this process (the request
        path then creates no coroutine); None: this store waits for its answer -- await
        :meth:`admit`."""
        ...

    async def settle(self, a: Allowance, spent: Spent) -> None:
        """Replace a request's reservation with what it really used (at most once per id)."""
        ...

    def settle_now(self, a: Allowance, spent: Spent) -> bool:
        """:meth:`settle` without waiting, when the store keeps its state in this process;
        False: nothing was done -- await :meth:`settle`."""
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
    #: the request's reservation id ('' : it reserved nothing; its settlement gets one)
    rid: str = ""


def new_rid() -> str:
    """A reservation's id: unique per request, whatever id the client sent."""
    return os.urandom(12).hex()


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
    "IN_FLIGHT_RETRY_S",
    "LEASES",
    "WINDOW_S",
    "Allowance",
    "Budget",
    "Limits",
    "Spent",
    "Verdict",
    "budget_refusal",
    "check_gcra",
    "debit_gcra",
    "new_rid",
    "reset_text",
    "spend_key",
]
