"""Spend (docs/spec.md §20): prices, the cost of a request, the worst case it may cost, periods.

Prices are USD per 1M tokens, matched by model glob (``[[prices]]``, the first entry whose
pattern matches wins) and resolved once per model name (:meth:`Prices.of`, a bounded memo).
A request's cost is worked out once, at its end, from the one usage record its protocol filled
(:class:`gateway.context.Usage`) — :func:`cost` — and everything that shows it (the root span's
``gateway.cost_usd``, the access log's ``cost_usd``, ``gateway_cost_usd_total``, the live view,
budgets) reads that one number::

    cost = ((input - cached - cache_write) * input_price + cached * cached_input_price
            + cache_write * cache_write_price + output * output_price) / 10**6

A cache hit costs nothing; a model without a price has no cost (None); an answer that
completed without reporting usage costs what it reserved (:func:`unreported`: the budget is
charged that, and the span, the access log and the metric say that). Budgets count in whole
nano-dollars (:func:`nano`), so every replica and the Redis script add the same integers.

Before a request goes upstream its worst case is reserved (:func:`estimate`): the body's UTF-8
bytes / 4 input tokens at the input price, plus the most it may write — ``max_tokens`` /
``max_completion_tokens`` / ``max_output_tokens`` (times ``n``), else the route's
``max_tokens_cap``, else :data:`DEFAULT_MAX_OUTPUT` — at the output price.

Budget periods are UTC calendar periods (:func:`period_bounds`): a day, an ISO week (from
Monday), a month, or ``total`` (never resets). The Redis script in :mod:`gateway.budgets.limits`
does the same integer arithmetic on Redis's clock.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from typing import Any, Final

from gateway.config import PriceConfig
from gateway.context import RequestContext, Usage
from gateway.memo import remember

#: the output reserved for a request that sets no limit and whose route has no cap
DEFAULT_MAX_OUTPUT: Final = 4096
#: bytes of request body per estimated input token
BYTES_PER_TOKEN: Final = 4
#: operations that write no tokens (their reservation is input only)
NO_OUTPUT: Final = frozenset({"embeddings"})
#: operations that are no inference: nothing is reserved, nothing costs
NOT_INFERENCE: Final = frozenset({"count_tokens"})
_MEMO_MAX: Final = 4096
#: period name -> the code the Redis script knows it by
PERIOD_CODES: Final = {"total": 0, "day": 1, "week": 2, "month": 3}
PERIOD_TEXT: Final = ("in total", "today", "this week", "this month")


class Price:
    """The prices of one ``[[prices]]`` entry, in USD per 1M tokens."""

    __slots__ = ("batch_discount", "cache_write", "cached_input", "input", "output")

    def __init__(self, cfg: PriceConfig) -> None:
        self.input = cfg.input
        self.output = cfg.output
        self.cached_input = cfg.input if cfg.cached_input is None else cfg.cached_input
        self.cache_write = cfg.input if cfg.cache_write is None else cfg.cache_write
        self.batch_discount = cfg.batch_discount

    def cost(self, usage: Usage) -> float:
        """USD for this usage (docs/spec.md §20).

        >>> from gateway.config import PriceConfig
        >>> from gateway.context import Usage
        >>> u = Usage(); u.input, u.cached_input, u.output = 1000, 400, 100
        >>> Price(PriceConfig(("m",), 2.5, 10.0, cached_input=1.25)).cost(u)  # 600 + 400 + 100
        0.003
        """
        cached = usage.cached_input
        written = usage.cache_write
        fresh = (usage.input or 0) - cached - written
        return (
            max(fresh, 0) * self.input
            + cached * self.cached_input
            + written * self.cache_write
            + (usage.output or 0) * self.output
        ) / 1_000_000

    def reserve_nano(self, input_tokens: int, output_tokens: int, batch: bool = False) -> int:
        """The worst case of a request, in nano-USD (rounded up): input at the input price
        (``batch``: at the batch price, docs/spec.md §24).

        >>> from gateway.config import PriceConfig
        >>> p = Price(PriceConfig(("m",), 2.0, 8.0))
        >>> p.reserve_nano(1000, 100), p.reserve_nano(1000, 100, batch=True)
        (2800000, 1400000)
        """
        usd_k = (input_tokens * self.input + output_tokens * self.output) * 1000
        return math.ceil(usd_k * self.batch_discount if batch else usd_k)


class Prices:
    """``[[prices]]``: the price of a model, resolved once per model name.

    >>> from gateway.config import PriceConfig
    >>> prices = Prices((PriceConfig(("gpt-4o", "gpt-4o-2024-*"), 2.5, 10.0),))
    >>> prices.of("gpt-4o-2024-08-06").output, prices.of("gpt-4o-mini")
    (10.0, None)
    """

    def __init__(self, entries: Sequence[PriceConfig] = ()) -> None:
        self._entries = tuple((cfg.models, Price(cfg)) for cfg in entries)
        self._by_model: dict[str, Price | None] = {}

    def __bool__(self) -> bool:
        return bool(self._entries)

    def of(self, model: str) -> Price | None:
        try:
            return self._by_model[model]
        except KeyError:
            pass
        found = next(
            (
                price
                for patterns, price in self._entries
                if any(fnmatch.fnmatchcase(model, p) for p in patterns)
            ),
            None,
        )
        # model names come from clients and upstreams: the memo is bounded
        return remember(self._by_model, model, found, _MEMO_MAX)

    def for_request(self, ctx: RequestContext) -> Price | None:
        """The price of the model the request asked for, else of the one that answered."""
        model = ctx.model
        if model is None:
            return None
        price = self.of(model)
        if price is None:
            answered = ctx.answer.response_model
            if answered is not None and answered != model:
                price = self.of(answered)
        return price

    def cost(self, ctx: RequestContext) -> float | None:
        """The cost of a finished model call (None: not a model call, or no price)."""
        if ctx.call is None:
            return None
        price = self.for_request(ctx)
        if price is None:
            return None
        if ctx.cache.result == "hit":  # served by the gateway: no upstream tokens
            return 0.0
        answer = ctx.answer
        if answer.reserved_nano and unreported(ctx):  # the worst case its budget was charged
            return answer.reserved_nano / 1e9
        return price.cost(answer.tokens)


def unreported(ctx: RequestContext) -> bool:
    """A model call that completed without its upstream reporting usage (one that ignored the
    ``stream_options.include_usage`` the gateway asked for): it costs the worst case it was
    given, its reservation -- in its budget and in every figure that shows its cost."""
    answer = ctx.answer
    return (
        not answer.tokens.reported
        and ctx.call is not None
        and bool(ctx.attempts)
        and 200 <= answer.status < 300
        and answer.error is None
        and not ctx.disconnected
    )


def cost(ctx: RequestContext) -> float | None:
    """The request's cost in USD, worked out once (the first reader at the end computes it)."""
    answer = ctx.answer
    if not answer.costed:
        pricing = answer.pricing
        answer.cost_usd = pricing.cost(ctx) if pricing is not None else None
        answer.costed = True
    return answer.cost_usd


def nano(usd: float) -> int:
    """USD as whole nano-dollars (what budgets count in).

    >>> nano(0.0030000000000000005), nano(12.5)  # float noise is rounded away
    (3000000, 12500000000)
    """
    return round(usd * 1e9)


def estimate(
    body_bytes: int,
    payload: dict[str, Any],
    operation: str,
    limit_fields: tuple[str, ...],
    cap: int | None,
) -> tuple[int, int]:
    """(input tokens, most output tokens) a request may use: what is reserved before it goes
    upstream.

    >>> estimate(401, {"max_tokens": 50, "n": 2}, "chat", ("max_tokens",), None)
    (101, 100)
    >>> estimate(400, {}, "chat", ("max_tokens",), None)
    (100, 4096)
    >>> estimate(400, {"max_tokens": 9}, "embeddings", ("max_tokens",), None)
    (100, 0)
    """
    if operation in NOT_INFERENCE:
        return 0, 0
    input_tokens = -(-body_bytes // BYTES_PER_TOKEN)
    if operation in NO_OUTPUT:
        return input_tokens, 0
    most = 0
    for field in limit_fields:
        value = payload.get(field)
        if type(value) is int and value > most:
            most = value
    if most <= 0:
        most = cap or DEFAULT_MAX_OUTPUT
    n = payload.get("n")
    if type(n) is int and n > 1:  # n choices write n completions
        most *= n
    return input_tokens, most


def charge_relayed(ctx: RequestContext, content_events: int) -> None:
    """A stream the client cut before its usage arrived is charged from what was relayed
    (docs/spec.md §20, "nothing unbilled"), never $0: the input the upstream did not report is
    the reservation's estimate (the body's bytes / 4), and the output at least one token per
    content-bearing event relayed (a chat completions delta is one token; a larger delta counts
    one: a lower bound). The figures go into the one usage record, so tokens, cost, budget,
    metrics, span and access log all show them.

    >>> from gateway.context import RequestContext, Timeline
    >>> ctx = RequestContext({"method": "POST", "path": "/v1/chat/completions"}, Timeline())
    >>> ctx.call = type("Call", (), {"body": b"x" * 401})()
    >>> charge_relayed(ctx, 7)
    >>> ctx.answer.tokens.input, ctx.answer.tokens.output
    (101, 7)
    """
    usage = ctx.answer.tokens
    call = ctx.call
    if usage.input is None and call is not None:
        usage.input = -(-len(call.body) // BYTES_PER_TOKEN)
    if (usage.output or 0) < content_events:
        usage.output = content_events


# ---------------------------------------------------------------- periods (UTC calendar)


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm; the Redis
    script has the same lines).

    >>> days_from_civil(1970, 1, 1), days_from_civil(2000, 3, 1)
    (0, 11017)
    """
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int]:
    """(year, month) of a day number (the inverse of :func:`days_from_civil`).

    >>> civil_from_days(0), civil_from_days(11017)
    ((1970, 1), (2000, 3))
    """
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m


def period_bounds(code: int, now_s: float) -> tuple[int, int]:
    """(start, reset) in Unix seconds of the period holding ``now_s``; ``total`` is (0, 0): it
    started at the epoch and never resets.

    >>> period_bounds(PERIOD_CODES["week"], 0)  # 1970-01-01 was a Thursday
    (-259200, 345600)
    >>> period_bounds(PERIOD_CODES["month"], 86400 * 40)  # in February 1970
    (2678400, 5097600)
    """
    if code == 0:
        return 0, 0
    days = int(now_s // 86400)
    if code == 1:
        return days * 86400, (days + 1) * 86400
    if code == 2:
        monday = days - (days + 3) % 7
        return monday * 86400, (monday + 7) * 86400
    y, m = civil_from_days(days)
    start = days_from_civil(y, m, 1)
    y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return start * 86400, days_from_civil(y, m, 1) * 86400


#: period code -> the (start, reset) last worked out: a period changes once a day at most
_CURRENT: dict[int, tuple[int, int]] = {}


def current_period(code: int, now_s: int) -> tuple[int, int]:
    """:func:`period_bounds`, remembered while ``now_s`` stays inside the period."""
    if code == 0:
        return 0, 0
    bounds = _CURRENT.get(code)
    if bounds is None or not bounds[0] <= now_s < bounds[1]:
        bounds = _CURRENT[code] = period_bounds(code, now_s)
    return bounds


def usd_text(amount_nano: int) -> str:
    """Dollars for people: two decimals, more when the amount is under a dollar.

    >>> usd_text(12_500_000_000), usd_text(1_234_000), usd_text(0)
    ('$12.50', '$0.001234', '$0.00')
    """
    usd = amount_nano / 1e9
    if usd == 0 or abs(usd) >= 1:
        return f"${usd:,.2f}"
    return f"${usd:.6f}".rstrip("0")


__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "PERIOD_CODES",
    "Price",
    "Prices",
    "charge_relayed",
    "cost",
    "current_period",
    "estimate",
    "nano",
    "period_bounds",
    "unreported",
    "usd_text",
]
