"""The rate limiter on its own (gateway/hops/limits.py): the GCRA arithmetic, the per-process
buckets, and the Redis script against a real ``redis-server`` agreeing with them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cache.breaker import CircuitBreaker
from gateway.hops.limits import WINDOW_S, MemoryLimits, RedisLimits, check_gcra, debit_gcra
from tests.redis_support import RedisServer


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_of_rpm_then_one_every_60_over_rpm_seconds():
    clock = Clock()
    limits = MemoryLimits(clock)
    verdicts = [limits.check_now("k", 6, None) for _ in range(8)]
    assert [v.allowed for v in verdicts] == [True] * 6 + [False] * 2
    assert [v.remaining_requests for v in verdicts[:6]] == [5, 4, 3, 2, 1, 0]
    assert verdicts[6].refused_by == "requests"
    assert verdicts[6].retry_after_s == pytest.approx(10.0)  # 60 s / 6
    clock.t += 9.9
    assert not limits.check_now("k", 6, None).allowed
    clock.t += 0.2
    assert limits.check_now("k", 6, None).allowed
    clock.t += WINDOW_S  # a full minute idle: the whole burst is back
    assert [limits.check_now("k", 6, None).allowed for _ in range(7)] == [True] * 6 + [False]


def test_tokens_admit_while_any_budget_is_left_and_refuse_once_overdrawn():
    clock = Clock()
    limits = MemoryLimits(clock)
    assert limits.check_now("k", None, 100).remaining_tokens == 100
    limits.debit_now("k", 70, 100)
    v = limits.check_now("k", None, 100)
    assert v.allowed and v.remaining_tokens == 30
    limits.debit_now("k", 70, 100)  # 140 of 100: overdrawn by 40
    v = limits.check_now("k", None, 100)
    assert not v.allowed and v.refused_by == "tokens" and v.remaining_tokens == 0
    assert v.retry_after_s == pytest.approx(24.6)  # 40 tokens at 0.6 s each, plus one
    clock.t += 24.7
    assert limits.check_now("k", None, 100).allowed


def test_a_refusal_by_tokens_spends_no_request():
    clock = Clock()
    limits = MemoryLimits(clock)
    limits.debit_now("k", 200, 100)
    for _ in range(5):
        assert limits.check_now("k", 2, 100).refused_by == "tokens"
    clock.t += 130
    assert [limits.check_now("k", 2, 100).allowed for _ in range(3)] == [True, True, False]


def test_keys_have_their_own_buckets():
    limits = MemoryLimits(Clock())
    assert limits.check_now("a", 1, None).allowed
    assert not limits.check_now("a", 1, None).allowed
    assert limits.check_now("b", 1, None).allowed


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
    start = clock.t
    admitted = 0
    for gap in gaps:
        clock.t += gap
        v = limits.check_now("k", rpm, None)
        if v.allowed:
            admitted += 1
        else:
            assert v.retry_after_s > 0
            probe = MemoryLimits(clock)
            probe._tat = dict(limits._tat)
            clock.t += v.retry_after_s + 1e-6
            assert probe.check_now("k", rpm, None).allowed
            clock.t -= v.retry_after_s + 1e-6
        assert admitted <= rpm + (clock.t - start) * rpm / WINDOW_S + 1e-6


def test_gcra_and_debit_are_pure_functions_of_their_inputs():
    assert check_gcra(0.0, None, None, None, None)[0].allowed
    assert debit_gcra(10.0, 5.0, 10, 60) == 20.0  # a past tat counts from now


# ---------------------------------------------------------------- Redis


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def run(coro):
    return asyncio.run(coro)


def test_the_redis_script_agrees_with_the_arithmetic(redis):
    async def scenario() -> list[tuple[bool, int | None, int | None, str | None]]:
        limits = RedisLimits(redis.url, 500)
        out = []
        try:
            for _ in range(4):
                v = await limits.check("k1", 3, 50)
                out.append((v.allowed, v.remaining_requests, v.remaining_tokens, v.refused_by))
            await limits.debit("k1", 80, 50)
            v = await limits.check("k1", 3, 50)
            out.append((v.allowed, v.remaining_requests, v.remaining_tokens, v.refused_by))
            # 80 tokens at 1.2 s each = 96 s spent: 36 s over the window, plus one token
            assert 36.5 <= v.retry_after_s <= 37.2 + 1e-3
        finally:
            await limits.aclose()
        assert not limits.fallback
        return out

    got = run(scenario())
    memory = MemoryLimits(Clock())
    want = []
    for _ in range(4):
        v = memory.check_now("k1", 3, 50)
        want.append((v.allowed, v.remaining_requests, v.remaining_tokens, v.refused_by))
    memory.debit_now("k1", 80, 50)
    v = memory.check_now("k1", 3, 50)
    want.append((v.allowed, v.remaining_requests, v.remaining_tokens, v.refused_by))
    assert got == want
    assert got[-1] == (False, None, 0, "tokens")


def test_a_dead_redis_falls_back_to_counting_here_without_waiting(redis):
    async def scenario() -> None:
        breaker = CircuitBreaker(failures=2, reset_s=60)
        limits = RedisLimits(redis.url, 200, breaker=breaker)
        try:
            assert (await limits.check("k", 2, None)).allowed
            redis.kill()
            loop = asyncio.get_running_loop()
            started = loop.time()
            verdicts = [await limits.check("k", 2, None) for _ in range(4)]
            # two bounded failures open the breaker; then no network at all
            assert loop.time() - started < 2 * 0.2 + 0.5
            assert limits.fallback and breaker.state == "open"
            # counted here from the outage on: 2 admitted, then refused (never unlimited)
            assert [v.allowed for v in verdicts] == [True, True, False, False]
            await limits.debit("k", 10, 60)  # no raise: counted here too
        finally:
            await limits.aclose()

    run(scenario())
