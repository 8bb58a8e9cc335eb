"""The limiter on its own (gateway/budgets/limits.py): the GCRA arithmetic, budgets and their
reservations, the per-process state, and the Redis scripts against a real ``redis-server``
agreeing with them (periods included), falling back per process and catching up afterwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.budgets.limits import (
    WINDOW_S,
    Allowance,
    Budget,
    Spent,
    check_gcra,
    debit_gcra,
    spend_key,
)
from gateway.budgets.memory_limits import MemoryLimits
from gateway.budgets.redis_limits import RedisLimits
from gateway.budgets.reservations import RESERVE_TTL_S
from gateway.budgets.scripts import ADMIT_LUA
from gateway.budgets.spend import PERIOD_CODES, period_bounds
from gateway.store.breaker import CircuitBreaker
from tests.redis_support import RedisServer

USD = 1_000_000_000  # nano-USD


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def allowance(
    rpm: int | None = None,
    tpm: int | None = None,
    key_usd: float | None = None,
    tenant_usd: float | None = None,
    name: str = "k",
    period: str = "month",
) -> Allowance:
    key = (
        Budget(spend_key("t", "key:" + name), f"key t/{name}", key_usd, period) if key_usd else None
    )
    tenant = (
        Budget(spend_key("t", "tenant"), "tenant 't'", tenant_usd, period) if tenant_usd else None
    )
    return Allowance(name, "t", rpm, tpm, key, tenant)


def test_a_burst_of_rpm_then_one_every_60_over_rpm_seconds():
    clock = Clock()
    limits = MemoryLimits(clock)
    a = allowance(rpm=6)
    verdicts = [limits.admit_now(a, 0, 0) for _ in range(8)]
    assert [v.allowed for v in verdicts] == [True] * 6 + [False] * 2
    assert [v.remaining_requests for v in verdicts[:6]] == [5, 4, 3, 2, 1, 0]
    assert verdicts[6].refused_by == "requests"
    assert verdicts[6].retry_after_s == pytest.approx(10.0)  # 60 s / 6
    clock.t += 9.9
    assert not limits.admit_now(a, 0, 0).allowed
    clock.t += 0.2
    assert limits.admit_now(a, 0, 0).allowed
    clock.t += WINDOW_S  # a full minute idle: the whole burst is back
    assert [limits.admit_now(a, 0, 0).allowed for _ in range(7)] == [True] * 6 + [False]


def test_tokens_are_reserved_then_replaced_by_the_usage():
    clock = Clock()
    limits = MemoryLimits(clock)
    a = allowance(tpm=100)
    first = limits.admit_now(a, 70, 0, "r1")  # reserves 70 of 100
    assert first.allowed and first.remaining_tokens == 100
    v = limits.admit_now(a, 40, 0)  # 70 + 40 > 100: another one cannot overdraw meanwhile
    assert not v.allowed and v.refused_by == "tokens" and v.remaining_tokens == 30
    assert v.retry_after_s == pytest.approx(6.0)  # 10 tokens at 0.6 s
    limits.settle_now(a, Spent(70, 20, 0, 0, rid="r1"))  # it used 20: 50 come back
    v = limits.admit_now(a, 40, 0, "r2")
    assert v.allowed and v.remaining_tokens == 80
    limits.settle_now(a, Spent(40, 120, 0, 0, rid="r2"))  # the estimate was short: 80 more
    v = limits.admit_now(a, 0, 0)  # 140 of 100 spent: refused until the window frees up
    assert not v.allowed and v.remaining_tokens == 0
    assert v.retry_after_s == pytest.approx(24.6)  # 40 tokens at 0.6 s each, plus one
    clock.t += 24.7
    assert limits.admit_now(a, 0, 0).allowed


def test_a_refusal_spends_nothing():
    clock = Clock()
    limits = MemoryLimits(clock)
    a = allowance(rpm=2, tpm=100, key_usd=1.0)
    limits.settle_now(a, Spent(0, 200, 0, 0))
    for _ in range(5):
        assert limits.admit_now(a, 10, USD // 10).refused_by == "tokens"
    assert limits.view(a.key_budget)[2] == 0  # nothing reserved by the refusals
    clock.t += 130
    assert [limits.admit_now(a, 0, 0).allowed for _ in range(3)] == [True, True, False]


def test_keys_have_their_own_buckets():
    limits = MemoryLimits(Clock())
    a, b = allowance(rpm=1, name="a"), allowance(rpm=1, name="b")
    assert limits.admit_now(a, 0, 0).allowed
    assert not limits.admit_now(a, 0, 0).allowed
    assert limits.admit_now(b, 0, 0).allowed


@settings(max_examples=200, deadline=None)
@given(
    rpm=st.integers(1, 120),
    gaps=st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=300),
)
def test_never_more_than_the_bucket_allows(rpm, gaps):
    """Over any run, admitted <= rpm + elapsed * rpm / 60 (a full bucket plus its refill), and
    a refused request is told a wait after which it is admitted."""
    clock = Clock()
    limits = MemoryLimits(clock)
    a = allowance(rpm=rpm)
    start = clock.t
    admitted = 0
    for gap in gaps:
        clock.t += gap
        v = limits.admit_now(a, 0, 0)
        if v.allowed:
            admitted += 1
        else:
            assert v.retry_after_s > 0
            probe = MemoryLimits(clock)
            probe._tat = dict(limits._tat)
            clock.t += v.retry_after_s + 1e-6
            assert probe.admit_now(a, 0, 0).allowed
            clock.t -= v.retry_after_s + 1e-6
        assert admitted <= rpm + (clock.t - start) * rpm / WINDOW_S + 1e-6


def test_gcra_and_debit_are_pure_functions_of_their_inputs():
    assert check_gcra(0.0, None, None, None, None)[0].allowed
    assert debit_gcra(10.0, 5.0, 10, 60) == 20.0  # a past tat counts from now


# ---------------------------------------------------------------- budgets


def test_budget_reservations_keep_concurrent_requests_inside_the_budget():
    wall = Clock(datetime(2025, 5, 20, tzinfo=UTC).timestamp())
    limits = MemoryLimits(wall=wall)
    a = allowance(key_usd=1.0)
    admitted = [limits.admit_now(a, 0, 3 * USD // 10, f"r{i}") for i in range(5)]  # $0.30 each
    assert [v.allowed for v in admitted] == [True, True, True, False, False]
    assert [v.budget_left for v in admitted[:3]] == [USD, 7 * USD // 10, 4 * USD // 10]
    held = admitted[3]
    # it fits the budget alone: only the requests in flight keep it out, so it retries soon
    assert held.refused_by == "budget" and held.retry_after_s == 1.0 and held.spent == 0
    for i in range(3):
        limits.settle_now(a, Spent(0, 0, 3 * USD // 10, USD // 10, rid=f"r{i}"))  # $0.10 each
    assert limits.view(a.key_budget)[1:3] == (3 * USD // 10, 0)
    again = [limits.admit_now(a, 0, 3 * USD // 10, f"s{i}").allowed for i in range(3)]
    assert again == [True] * 2 + [False]


def test_a_request_that_cannot_fit_waits_for_the_period_reset_and_the_tenant_counts_too():
    start = datetime(2025, 5, 31, 23, 0, tzinfo=UTC).timestamp()
    wall = Clock(start)
    limits = MemoryLimits(wall=wall)
    one = allowance(key_usd=5.0, tenant_usd=1.0, name="one")
    two = allowance(tenant_usd=1.0, name="two")  # another key of the same tenant
    assert limits.admit_now(one, 0, 9 * USD // 10, "r1").allowed
    limits.settle_now(one, Spent(0, 0, 9 * USD // 10, 9 * USD // 10, rid="r1"))
    v = limits.admit_now(two, 0, 2 * USD // 10)  # the tenant's $1 is nearly gone
    assert v.refused_by == "budget" and v.budget is two.tenant_budget
    assert v.spent == 9 * USD // 10 and v.budget_left == USD // 10
    assert v.reset_at == int(datetime(2025, 6, 1, tzinfo=UTC).timestamp())
    assert v.retry_after_s == pytest.approx(3600)
    wall.t += 3600  # June: spent starts again
    assert limits.admit_now(two, 0, 2 * USD // 10).allowed


def test_a_total_budget_never_resets():
    limits = MemoryLimits(wall=Clock(1.7e9))
    a = allowance(key_usd=1.0, period="total")
    limits.settle_now(a, Spent(0, 0, 0, USD))
    v = limits.admit_now(a, 0, 1)
    assert v.refused_by == "budget" and v.reset_at == 0 and v.retry_after_s == 0
    assert limits.admit_now(a, 0, 0).allowed  # a request that costs nothing (a cache hit)


def test_a_reservation_whose_lease_nobody_renews_is_dropped_after_its_ttl():
    wall = Clock(1.7e9)
    limits = MemoryLimits(wall=wall, reserve_ttl_s=RESERVE_TTL_S)
    a = allowance(key_usd=1.0)
    assert limits.admit_now(a, 0, USD, "r1").allowed  # its replica died: never settled
    assert not limits.admit_now(a, 0, 1).allowed
    wall.t += RESERVE_TTL_S - 1
    limits.renew("r1")  # its replica is alive: the lease goes on
    wall.t += 2
    assert not limits.admit_now(a, 0, 1).allowed
    wall.t += RESERVE_TTL_S  # no renewal any more: its replica died
    assert limits.admit_now(a, 0, 1).allowed
    assert limits.view(a.key_budget)[1:3] == (0, 1)  # only the last one holds its nano-dollar


def test_in_one_process_a_reservation_lasts_as_long_as_its_request():
    wall = Clock(1.7e9)
    limits = MemoryLimits(wall=wall)
    a = allowance(key_usd=1.0)
    assert limits.admit_now(a, 0, USD, "r1").allowed
    wall.t += 10 * RESERVE_TTL_S  # a very long stream
    assert not limits.admit_now(a, 0, 1).allowed


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1)))
def test_periods_are_utc_calendar_periods(moment):
    at = moment.replace(tzinfo=UTC)
    now = at.timestamp()
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    next_month = (month + timedelta(days=32)).replace(day=1)
    monday = day - timedelta(days=day.weekday())
    assert period_bounds(PERIOD_CODES["day"], now) == (
        int(day.timestamp()),
        int((day + timedelta(days=1)).timestamp()),
    )
    assert period_bounds(PERIOD_CODES["week"], now) == (
        int(monday.timestamp()),
        int((monday + timedelta(days=7)).timestamp()),
    )
    assert period_bounds(PERIOD_CODES["month"], now) == (
        int(month.timestamp()),
        int(next_month.timestamp()),
    )
    assert period_bounds(PERIOD_CODES["total"], now) == (0, 0)


# ---------------------------------------------------------------- Redis


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def run(coro):
    return asyncio.run(coro)


def _row(v):
    return (v.allowed, v.refused_by, v.remaining_requests, v.remaining_tokens, v.budget_left)


def test_the_redis_script_agrees_with_the_arithmetic(redis):
    a = allowance(rpm=3, tpm=50, key_usd=1.0, tenant_usd=0.6)  # the tenant's is the tighter
    quarter, twentieth = USD // 4, USD // 20
    steps = [(10, quarter), (10, quarter), (10, quarter), (10, twentieth), (10, USD // 100)]

    async def scenario() -> list[tuple]:
        limits = RedisLimits(redis.url, 500)
        out = []
        try:
            for i, (tokens, cost) in enumerate(steps):
                out.append(_row(await limits.admit(a, tokens, cost, f"q{i}")))
            await limits.settle(a, Spent(10, 80, quarter, USD // 10, rid="q0"))
            v = await limits.admit(a, 0, 0)
            out.append(_row(v))
            # 30 reserved + 70 more = 100 tokens at 1.2 s each = 120 s: 60 s over, plus one
            assert 61.0 <= v.retry_after_s <= 61.2 + 1e-3
        finally:
            await limits.aclose()
        assert not limits.fallback
        return out

    got = run(scenario())
    memory = MemoryLimits(Clock())
    want = [
        _row(memory.admit_now(a, tokens, cost, f"q{i}")) for i, (tokens, cost) in enumerate(steps)
    ]
    memory.settle_now(a, Spent(10, 80, quarter, USD // 10, rid="q0"))
    want.append(_row(memory.admit_now(a, 0, 0)))
    assert got == want
    assert got == [
        (True, None, 2, 50, 6 * USD // 10),
        (True, None, 1, 40, 6 * USD // 10 - quarter),
        (False, "budget", None, None, USD // 10),  # the tenant's: $0.50 in flight of $0.60
        (True, None, 0, 30, USD // 10),
        (False, "requests", 0, 20, twentieth),
        (False, "tokens", None, 0, 2 * USD // 10),  # $0.10 spent, $0.30 still in flight
    ]


@pytest.mark.parametrize("period", ["day", "week", "month"])
def test_the_redis_periods_are_the_python_ones(redis, period):
    """The script on Redis's clock puts a budget in the period Python computes (for now)."""
    a = allowance(key_usd=1.0, period=period)

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 500)
        try:
            await limits.admit(a, 0, 5)
        finally:
            await limits.aclose()

    run(scenario())
    start, _ = period_bounds(PERIOD_CODES[period], time.time())
    stored = redis.command(b"HGET " + a.key_budget.id.encode() + b" s")
    assert int(stored) == start
    ttl = int(redis.command(b"TTL " + a.key_budget.id.encode())[1:])
    _, reset = period_bounds(PERIOD_CODES[period], time.time())
    assert 0 < ttl <= reset - time.time() + 86400 + 1  # kept one day past the reset


def test_every_key_a_script_touches_shares_the_tenants_hash_tag():
    a = allowance(rpm=1, tpm=1, key_usd=1.0, tenant_usd=1.0)
    tags = {k[k.index("{") : k.index("}") + 1] for k in (a.r_key, a.t_key, a.kb_key, a.tb_key)}
    assert tags == {"{t}"}
    assert ADMIT_LUA.count("KEYS[") >= 4


def test_a_dead_redis_falls_back_to_counting_here_without_waiting(redis):
    async def scenario() -> None:
        breaker = CircuitBreaker(failures=2, reset_s=60)
        limits = RedisLimits(redis.url, 200, breaker=breaker)
        a = allowance(rpm=2, tpm=60)
        try:
            assert (await limits.admit(a, 0, 0)).allowed
            redis.kill()
            loop = asyncio.get_running_loop()
            started = loop.time()
            verdicts = [await limits.admit(a, 0, 0) for _ in range(4)]
            # two bounded failures open the breaker; then no network at all
            assert loop.time() - started < 2 * 0.2 + 0.5
            assert limits.fallback and breaker.state == "open"
            # counted here from the outage on: 2 admitted, then refused (never unlimited)
            assert [v.allowed for v in verdicts] == [True, True, False, False]
            assert not any(v.shared for v in verdicts)
            await limits.settle(a, Spent(0, 10, 0, 0))  # no raise: counted here too
        finally:
            await limits.aclose()

    run(scenario())


def test_spending_while_redis_is_away_starts_from_what_redis_said_and_is_told_afterwards(redis):
    """The breaker is opened by hand (what a dead Redis does to it): no command reaches Redis
    meanwhile, so none can run late and be counted twice."""
    a = allowance(key_usd=1.0)

    async def scenario() -> None:
        breaker = CircuitBreaker(failures=1, reset_s=0.2)
        limits = RedisLimits(redis.url, 200, breaker=breaker)
        try:
            v = await limits.admit(a, 0, 6 * USD // 10, "r1")
            await limits.settle(a, Spent(0, 0, 6 * USD // 10, 6 * USD // 10, rid="r1"))
            breaker.failure()  # open: the limiter no longer asks Redis
            v = await limits.admit(a, 0, 3 * USD // 10, "r2")  # counted here, from the $0.60 seen
            assert v.allowed and not v.shared and v.budget_left == 4 * USD // 10
            assert not (await limits.admit(a, 0, 3 * USD // 10, "r3")).allowed  # 0.6 + 0.3 + 0.3
            await limits.settle(a, Spent(0, 0, 3 * USD // 10, 2 * USD // 10, rid="r2"))
            assert limits.view(a.key_budget)[1:3] == (8 * USD // 10, 0)
            await asyncio.sleep(0.3)  # the breaker lets a probe through again
            # the next admission replays what was spent meanwhile before Redis decides it
            v = await limits.admit(a, 0, USD // 10, "r4")
            assert v.shared and v.budget_left == 2 * USD // 10
            assert limits.owed == 0
            await limits.settle(a, Spent(0, 0, USD // 10, 0, rid="r4"))
            assert limits.view(a.key_budget)[1:3] == (8 * USD // 10, 0)
        finally:
            await limits.aclose()

    run(scenario())
    spent = int(redis.command(b"HGET " + a.key_budget.id.encode() + b" p"))
    reserved = int(redis.command(b"HGET " + a.key_budget.id.encode() + b" r"))
    assert (spent, reserved) == (8 * USD // 10, 0)  # $0.60 + the $0.20 spent while away


def test_the_report_reads_redis_and_falls_back_to_this_process(redis):
    a = allowance(key_usd=2.0, tenant_usd=5.0)

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 200, breaker=CircuitBreaker(1, 60))
        try:
            v = await limits.admit(a, 0, USD, "r1")
            assert v.allowed and v.shared
            await limits.settle(a, Spent(0, 0, USD, USD // 2, rid="r1"))
            await limits.admit(a, 0, USD // 4, "r2")  # in flight
            rows, shared = await limits.report([a.key_budget, a.tenant_budget])
            assert shared
            assert [r[1:3] for r in rows] == [(USD // 2, USD // 4)] * 2
            redis.kill()
            rows, shared = await limits.report([a.key_budget])
            assert not shared and rows[0][1] == USD // 2
        finally:
            await limits.aclose()

    run(scenario())


def test_a_fallback_counts_the_reservations_redis_made_for_requests_still_in_flight(redis):
    a = allowance(key_usd=1.0)

    async def scenario() -> None:
        breaker = CircuitBreaker(failures=1, reset_s=60)
        limits = RedisLimits(redis.url, 200, breaker=breaker)
        try:
            held = await limits.admit(a, 0, 7 * USD // 10, "r1")  # in flight, reserved in Redis
            assert held.allowed and held.shared
            breaker.failure()  # Redis away
            v = await limits.admit(a, 0, 4 * USD // 10, "r2")  # 0.7 in flight + 0.4 > 1
            assert not v.allowed and not v.shared and v.retry_after_s == 1.0
            await limits.settle(a, Spent(0, 0, 7 * USD // 10, USD // 10, rid="r1"))
            assert (await limits.admit(a, 0, 4 * USD // 10, "r3")).allowed  # 0.1 spent + 0.4
        finally:
            await limits.aclose()

    run(scenario())
