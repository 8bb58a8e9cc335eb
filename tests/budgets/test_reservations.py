"""One reservation per request, against real ``redis-server`` processes (budgets that never
lose or double-count a cent): a dead replica's reservation expires while the budget is busy, a
live request's does not, a settlement or an admission that timed out (Redis stalled with
``DEBUG SLEEP``) is applied exactly once, a request admitted per process while Redis was away is
held there before Redis admits anything new, a request admitted in one period is booked to it,
and the per-process store follows the same table as the scripts."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.budgets.limits import Allowance, Budget, Spent, spend_key
from gateway.budgets.memory_limits import MemoryLimits
from gateway.budgets.redis_limits import RedisLimits
from gateway.budgets.reservations import (
    ADMIT,
    EXPIRE,
    EXPIRED,
    HOLD,
    RESERVED,
    SETTLE,
    SETTLED,
    TRANSITIONS,
    step,
)
from gateway.budgets.spend import PERIOD_CODES, period_bounds
from gateway.store.breaker import CircuitBreaker
from tests.redis_support import RedisServer

USD = 1_000_000_000


def allowance(key_usd: float | None = 1.0, tenant_usd: float | None = None) -> Allowance:
    key = Budget(spend_key("t", "key:k"), "key t/k", key_usd, "month") if key_usd else None
    tenant = (
        Budget(spend_key("t", "tenant"), "tenant 't'", tenant_usd, "month") if tenant_usd else None
    )
    return Allowance("k", "t", None, None, key, tenant)


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=("--enable-debug-command", "local")) as server:
        yield server


def stored(redis: RedisServer, b: Budget) -> tuple[int, int]:
    """(spent, reserved) of a budget as Redis holds it."""
    fields = []
    for name in (b"p", b"r"):
        reply = redis.command(b"HGET " + b.id.encode() + b" " + name)
        fields.append(int(reply) if reply.strip() not in (b"", b"$-1") else 0)
    return fields[0], fields[1]


def stall(redis: RedisServer, seconds: float) -> socket.socket:
    """``DEBUG SLEEP``: Redis stops answering for ``seconds`` (it still receives commands, and
    runs them when it wakes). The reply is left unread; close the socket afterwards."""
    sock = socket.create_connection(("127.0.0.1", redis.port))
    sock.sendall(b"DEBUG SLEEP %g\r\n" % seconds)
    time.sleep(0.05)  # the sleep has begun before the caller's command goes out
    return sock


def test_the_table_is_total_for_the_events_that_can_happen():
    # every state answers a settle and an admit; only a live reservation can expire
    for state in (None, RESERVED, EXPIRED, SETTLED):
        assert step(state, SETTLE)[0] == SETTLED
        assert (state, ADMIT) in TRANSITIONS
        # a hold reserves only what has no record: never twice, never after a settlement
        assert step(state, HOLD) == (
            (RESERVED, False, False, True) if state is None else (state, False, False, False)
        )
    assert [s for s, e in TRANSITIONS if e == EXPIRE] == [RESERVED]
    # spending happens on exactly one settle per id
    assert step(SETTLED, SETTLE)[1:3] == (False, False)
    assert step(EXPIRED, SETTLE)[1:3] == (False, True)  # its lease is gone: spend only


def test_a_dead_replicas_reservation_expires_while_another_keeps_the_budget_busy(redis):
    a = allowance()

    async def scenario() -> None:
        dead = RedisLimits(redis.url, 500, reserve_ttl_s=2)
        live = RedisLimits(redis.url, 500, reserve_ttl_s=2)
        try:
            assert (await dead.admit(a, 0, 3 * USD // 10, "dead-1")).allowed
            if dead._renewing is not None:  # the replica dies: nothing renews its lease
                dead._renewing.cancel()
            for i in range(8):  # one request every 0.5 s, for 4 s
                assert (await live.admit(a, 0, USD // 10, f"live-{i}")).allowed
                await live.settle(a, Spent(0, 0, USD // 10, USD // 100, rid=f"live-{i}"))
                await asyncio.sleep(0.5)
            rows, shared = await live.report([a.key_budget])
            assert shared
            assert rows[0][1:3] == (8 * USD // 100, 0)  # the dead one's $0.30 is released
        finally:
            await live.aclose()
            await dead.client.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (8 * USD // 100, 0)


def test_a_live_request_longer_than_the_lease_keeps_its_reservation(redis):
    a = allowance()

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 500, reserve_ttl_s=2)
        other = RedisLimits(redis.url, 500, reserve_ttl_s=2)
        try:
            assert (await limits.admit(a, 0, 7 * USD // 10, "long")).allowed
            await asyncio.sleep(3.5)  # a stream outliving the lease: renewed meanwhile
            rows, _ = await other.report([a.key_budget])
            assert rows[0][2] == 7 * USD // 10
            # another replica cannot overdraw the budget while it streams
            assert not (await other.admit(a, 0, 4 * USD // 10, "x")).allowed
            await limits.settle(a, Spent(0, 0, 7 * USD // 10, 6 * USD // 10, rid="long"))
        finally:
            await limits.aclose()
            await other.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (6 * USD // 10, 0)


def test_a_settlement_that_timed_out_is_applied_once(redis):
    """The review's reproduction: ``timeout_ms = 100``, Redis stalled for 1 s during the
    settlement of one $0.50 request. It used to end with spent = $1.00."""
    a = allowance(tenant_usd=5.0)

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 100, breaker=CircuitBreaker(5, 0.1))
        try:
            await limits.settle(a, Spent(0, 0, 0, 0, rid="warm"))  # the script is loaded
            assert (await limits.admit(a, 0, USD, "one")).allowed
            sock = stall(redis, 1.0)
            await limits.settle(a, Spent(0, 0, USD, USD // 2, rid="one"))  # times out
            assert limits.owed == 1
            await asyncio.sleep(1.2)  # Redis wakes and runs the settlement it received
            sock.close()
            assert stored(redis, a.key_budget) == (USD // 2, 0)  # it ran, late
            # the next request through replays the ledger: the script finds it settled
            assert (await limits.admit(a, 0, USD // 10, "two")).allowed
            await limits.settle(a, Spent(0, 0, USD // 10, USD // 10, rid="two"))
            assert limits.owed == 0
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (6 * USD // 10, 0)
    assert stored(redis, a.tenant_budget) == (6 * USD // 10, 0)


def test_an_admission_that_timed_out_is_resolved_when_redis_answers(redis):
    """Redis stalled during the admission: the script ran late (reserving $1.00) while this
    process admitted the request locally. Its settlement releases that reservation."""
    a = allowance()

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 100, breaker=CircuitBreaker(5, 0.1))
        try:
            assert (await limits.admit(a, 0, 0, "warm")).allowed  # the script is loaded
            sock = stall(redis, 1.0)
            v = await limits.admit(a, 0, USD, "one")
            assert v.allowed and not v.shared  # admitted here
            await asyncio.sleep(1.2)
            sock.close()
            assert stored(redis, a.key_budget) == (0, USD)  # the late script reserved
            await limits.settle(a, Spent(0, 0, USD, USD // 2, rid="one"))
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (USD // 2, 0)


def test_a_refused_admission_that_timed_out_releases_what_redis_reserved(redis):
    a = allowance()

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 100, breaker=CircuitBreaker(5, 0.1))
        try:
            assert (await limits.admit(a, 0, 0, "warm")).allowed  # the script is loaded
            limits.local.hold(a, "in-flight", 8 * USD // 10)  # this process sees $0.80 held
            sock = stall(redis, 1.0)
            v = await limits.admit(a, 0, 5 * USD // 10, "refused")
            assert not v.allowed  # refused here; Redis (empty) reserves it when it wakes
            assert limits.owed == 1  # its release waits in the ledger, replayed when Redis is back
            for _ in range(50):
                await asyncio.sleep(0.1)
                if not limits.owed:
                    break
            sock.close()
            assert stored(redis, a.key_budget) == (0, 0)
            v = await limits.admit(a, 0, USD // 10, "next")
            await limits.settle(a, Spent(0, 0, USD // 10, USD // 10, rid="next"))
            assert limits.owed == 0
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (USD // 10, 0)


def test_a_replica_killed_mid_request_and_redis_restarted_loses_no_cent(redis):
    """Two replicas; Redis is killed while requests are in flight and started again; every
    settlement reaches it exactly once."""
    a = allowance(key_usd=100.0)
    costs = [USD // 7, USD // 3, USD // 11, USD // 5]

    async def scenario() -> None:
        one = RedisLimits(redis.url, 200, breaker=CircuitBreaker(1, 0.2))
        two = RedisLimits(redis.url, 200, breaker=CircuitBreaker(1, 0.2))
        try:
            for i in range(len(costs)):
                assert (await (one, two)[i % 2].admit(a, 0, USD, f"r{i}")).allowed
            redis.kill()
            for i, c in enumerate(costs[:2]):  # these end while Redis is away
                await (one, two)[i % 2].settle(a, Spent(0, 0, USD, c, rid=f"r{i}"))
            redis.start()
            await asyncio.sleep(0.3)
            for i, c in enumerate(costs[2:], 2):  # these end after: each replays its ledger
                await (one, two)[i % 2].settle(a, Spent(0, 0, USD, c, rid=f"r{i}"))
            assert one.owed == two.owed == 0
        finally:
            await one.aclose()
            await two.aclose()

    asyncio.run(scenario())
    # the restarted Redis lost the reservations with its data; the spending is all there
    assert stored(redis, a.key_budget) == (sum(costs), 0)


def test_a_request_admitted_in_one_period_is_booked_to_it():
    """The month turns while a request streams: the new month starts with nothing reserved,
    and the request's cost goes to the month it was admitted in."""
    wall = [datetime(2025, 5, 31, 23, 59, 50, tzinfo=UTC).timestamp()]
    limits = MemoryLimits(wall=lambda: wall[0])
    a = allowance(key_usd=1.0)
    assert limits.admit_now(a, 0, 9 * USD // 10, "may").allowed
    wall[0] += 20  # June
    assert limits.view(a.key_budget)[1:3] == (0, 0)
    assert limits.admit_now(a, 0, 9 * USD // 10, "june").allowed  # May's reservation is May's
    limits.settle_now(a, Spent(0, 0, 9 * USD // 10, 4 * USD // 10, rid="may"))
    limits.settle_now(a, Spent(0, 0, 9 * USD // 10, 3 * USD // 10, rid="june"))
    state = limits._spend[a.key_budget.id]
    assert (state.spent, state.reserved, state.pspent) == (3 * USD // 10, 0, 4 * USD // 10)


def test_the_redis_script_books_a_late_settlement_to_its_period(redis):
    """As above, in Redis: the request's record and lease name the period it was made in
    (moved one month back here, as if it had been admitted then)."""
    a = allowance()
    start, _ = period_bounds(PERIOD_CODES["month"], time.time())
    before, _ = period_bounds(PERIOD_CODES["month"], start - 1)

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 500)
        try:
            assert (await limits.admit(a, 0, 9 * USD // 10, "old")).allowed
            limits._live.clear()  # (its lease is rewritten below)
            key = a.key_budget.id.encode()
            record = (a.record_prefix + "old").encode()
            leases = key + b":leases"
            redis.command(b"HSET " + key + b" s %d p 123" % before)
            redis.command(b"DEL " + leases)
            redis.command(
                b"ZADD " + leases + b" %d old|%d|%d" % (time.time() + 60, 9 * USD // 10, before)
            )
            redis.command(b"HSET " + record + b" ks %d" % before)
            # this month: nothing spent, nothing reserved; last month's request still counts there
            rows, _ = await limits.report([a.key_budget])
            assert rows[0][1:3] == (0, 0)
            await limits.settle(a, Spent(0, 0, 9 * USD // 10, 4 * USD // 10, rid="old"))
            # one this process admitted itself last month (Redis was away): Redis has no record
            # of it, and books it where this process says it was admitted
            limits.local._records["local"] = ["r", 0, 0, {a.key_budget.id: before}]
            await limits.settle(a, Spent(0, 0, 0, USD // 10, rid="local"))
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    key = a.key_budget.id.encode()
    assert int(redis.command(b"HGET " + key + b" q")) == before
    assert int(redis.command(b"HGET " + key + b" o")) == 123 + 5 * USD // 10
    assert stored(redis, a.key_budget) == (0, 0)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "settle", "hold"]),
        st.integers(0, 5),  # which request id
        st.integers(0, 4),  # cost in tenths of a dollar
    ),
    min_size=1,
    max_size=25,
)


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@settings(max_examples=40, deadline=None)
@given(ops=_ops)
def test_the_scripts_and_the_memory_store_follow_one_table(shared_redis, ops):
    """Random admits, holds and settles (repeats, unknown ids, settles before admits, holds of
    admitted or settled ids) leave the same spent and reserved in Redis and in this process."""
    shared_redis.command(b"FLUSHALL")
    a = allowance(key_usd=1.0, tenant_usd=1.5)
    memory = MemoryLimits()

    async def scenario() -> list[tuple[bool, tuple[int, ...]]]:
        limits = RedisLimits(shared_redis.url, 500)
        out = []
        try:
            for op, n, tenths in ops:
                rid, cost = f"r{n}", tenths * USD // 10
                if op == "admit":
                    got = (await limits.admit(a, 0, cost, rid)).allowed
                    want = memory.admit_now(a, 0, cost, rid).allowed
                elif op == "hold":  # never refused, whatever is left
                    await limits.hold(a, rid, 0, cost)
                    memory.hold(a, rid, cost)
                    got = want = True
                else:
                    spent = Spent(0, 0, 0, cost // 2, rid=rid)
                    await limits.settle(a, spent)
                    memory.settle_now(a, spent)
                    got = want = True
                rows, _ = await limits.report(list(a.budgets))
                mine = tuple(x for b in a.budgets for x in memory.view(b)[1:3])
                out.append((got == want, tuple(x for r in rows for x in r[1:3]) + mine))
        finally:
            await limits.aclose()
        return out

    for same, row in asyncio.run(scenario()):
        assert same
        assert row[:4] == row[4:]


def test_a_dead_replicas_reservation_is_released_after_the_budget_was_idle(redis):
    """Nothing touches the budget for longer than the lease (and longer than any expiry a
    lease set could have had): the next touch still sweeps the dead one's lease."""
    a = allowance()

    async def scenario() -> None:
        dead = RedisLimits(redis.url, 500, reserve_ttl_s=2)
        live = RedisLimits(redis.url, 500, reserve_ttl_s=2)
        try:
            assert (await dead.admit(a, 0, 3 * USD // 10, "dead-1")).allowed
            if dead._renewing is not None:
                dead._renewing.cancel()
            await asyncio.sleep(4.5)
            rows, _ = await live.report([a.key_budget])
            assert rows[0][1:3] == (0, 0)
            assert (await live.admit(a, 0, 8 * USD // 10, "next")).allowed
        finally:
            await live.aclose()
            await dead.client.aclose()

    asyncio.run(scenario())


def test_a_long_request_survives_any_number_of_settled_ones_in_one_process():
    """The settled ids this store remembers are bounded; the live ones are never evicted."""
    limits = MemoryLimits()
    a = allowance(key_usd=1000.0)
    assert limits.admit_now(a, 0, USD // 10, "long").allowed
    for i in range(100_001):
        limits.admit_now(a, 0, 1, f"r{i}")
        limits.settle_now(a, Spent(0, 0, 1, 1, rid=f"r{i}"))
    limits.settle_now(a, Spent(0, 0, USD // 10, USD // 20, rid="long"))
    assert limits.view(a.key_budget)[1:3] == (100_001 + USD // 20, 0)


def test_a_cancelled_admission_is_released_when_redis_answers(redis):
    """The request's task is cancelled while its admission waits for a stalled Redis (the
    script runs when Redis wakes): its release waits in the ledger."""
    a = allowance()

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 2000, breaker=CircuitBreaker(5, 0.1))
        try:
            assert (await limits.admit(a, 0, 0, "warm")).allowed  # the script is loaded
            sock = stall(redis, 1.0)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await limits.admit(a, 0, 3 * USD // 10, "cancelled")
            assert limits.owed == 1
            for _ in range(50):
                await asyncio.sleep(0.1)
                if not limits.owed:
                    break
            sock.close()
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (0, 0)


def test_a_hash_left_by_the_release_before_drops_its_bare_reserved_sum(redis):
    a = allowance()
    key = a.key_budget.id.encode()
    start, _ = period_bounds(PERIOD_CODES["month"], time.time())
    redis.command(b"HSET " + key + b" s %d p 100 r 400000000 u %d" % (start, time.time()))

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 500)
        try:
            rows, _ = await limits.report([a.key_budget])
            assert rows[0][1:3] == (100, 0)
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert redis.command(b"HEXISTS " + key + b" u") == b":0"


def test_a_request_admitted_while_redis_was_away_is_held_there_before_it_admits_more(redis):
    """The breaker is open (what a dead Redis does to it): a $0.70 request is admitted here and
    is still running when Redis answers again. The next admission holds it in Redis first, so
    Redis refuses a $0.40 one (the reproduction: admitted, $1.10 of a $1.00 budget)."""
    a = allowance()

    async def scenario() -> None:
        breaker = CircuitBreaker(failures=1, reset_s=0.2)
        limits = RedisLimits(redis.url, 500, breaker=breaker)
        try:
            assert (await limits.admit(a, 0, 0, "warm")).allowed  # the scripts are loaded
            breaker.failure()
            v = await limits.admit(a, 0, 7 * USD // 10, "away")
            assert v.allowed and not v.shared and limits.unheard == 1
            assert stored(redis, a.key_budget) == (0, 0)  # Redis has not heard of it
            await asyncio.sleep(0.3)  # Redis answers again
            v = await limits.admit(a, 0, 4 * USD // 10, "next")
            assert not v.allowed and v.shared and v.refused_by == "budget"
            assert limits.unheard == 0
            assert stored(redis, a.key_budget) == (0, 7 * USD // 10)
            assert "away" in limits._live  # its lease is renewed from here on
            await limits.settle(a, Spent(0, 0, 7 * USD // 10, 6 * USD // 10, rid="away"))
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (6 * USD // 10, 0)


def test_a_held_request_is_held_without_traffic_once_redis_answers(redis):
    """Nothing else happens after the outage: the backlog's own retry holds the request, so
    another replica sees it before this one admits anything."""
    a = allowance()

    async def scenario() -> None:
        breaker = CircuitBreaker(failures=1, reset_s=0.2)
        limits = RedisLimits(redis.url, 500, breaker=breaker)
        other = RedisLimits(redis.url, 500)
        try:
            breaker.failure()
            assert (await limits.admit(a, 0, 7 * USD // 10, "away")).allowed
            for _ in range(50):
                await asyncio.sleep(0.1)
                if not limits.unheard:
                    break
            assert not (await other.admit(a, 0, 4 * USD // 10, "elsewhere")).allowed
            await limits.settle(a, Spent(0, 0, 7 * USD // 10, 7 * USD // 10, rid="away"))
        finally:
            await limits.aclose()
            await other.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (7 * USD // 10, 0)


def test_a_hold_after_an_admission_that_ran_late_counts_it_once(redis):
    """Redis stalled during the admission: this process admitted the request itself and Redis
    ran the script when it woke. The hold finds the record and reserves nothing more."""
    a = allowance()

    async def scenario() -> None:
        limits = RedisLimits(redis.url, 100, breaker=CircuitBreaker(5, 0.1))
        try:
            assert (await limits.admit(a, 0, 0, "warm")).allowed  # the scripts are loaded
            sock = stall(redis, 1.0)
            v = await limits.admit(a, 0, 3 * USD // 10, "late")
            assert v.allowed and not v.shared and limits.unheard == 1
            await asyncio.sleep(1.2)
            sock.close()
            assert (await limits.admit(a, 0, USD // 10, "after")).allowed
            assert limits.unheard == 0
            assert stored(redis, a.key_budget) == (0, 4 * USD // 10)  # $0.30 once, + $0.10
            await limits.settle(a, Spent(0, 0, 3 * USD // 10, USD // 10, rid="late"))
            await limits.settle(a, Spent(0, 0, USD // 10, USD // 10, rid="after"))
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (2 * USD // 10, 0)


def test_a_request_that_ends_before_redis_answers_is_settled_not_held(redis):
    a = allowance()

    async def scenario() -> None:
        breaker = CircuitBreaker(failures=1, reset_s=0.2)
        limits = RedisLimits(redis.url, 500, breaker=breaker)
        try:
            breaker.failure()
            assert (await limits.admit(a, 0, 7 * USD // 10, "away")).allowed
            await limits.settle(a, Spent(0, 0, 7 * USD // 10, 5 * USD // 10, rid="away"))
            assert (limits.unheard, limits.owed) == (0, 1)  # its settlement replaces its hold
            await asyncio.sleep(0.3)
            assert (await limits.admit(a, 0, 5 * USD // 10, "next")).allowed  # $0.50 + $0.50
            assert not (await limits.admit(a, 0, USD // 10, "over")).allowed
            await limits.settle(a, Spent(0, 0, 5 * USD // 10, 5 * USD // 10, rid="next"))
        finally:
            await limits.aclose()

    asyncio.run(scenario())
    assert stored(redis, a.key_budget) == (USD, 0)
