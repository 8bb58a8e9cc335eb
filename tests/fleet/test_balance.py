"""least_loaded, saturation and shedding (docs/spec.md §21), driven through the health hop's
``order`` with loads published as a scraper would (the scrapers themselves: test_fleet.py;
over real sockets: tests/test_fleet.py)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from gateway.config import BackendConfig, RouteConfig
from gateway.context import Attempt
from gateway.errors import BackendSaturated
from gateway.fleet.balance import LeastLoaded
from gateway.fleet.health import CONNECTION_FAILED, SUCCESS, Health
from gateway.fleet.load import STALE_PERIODS, Load
from gateway.routes import Backend, Route
from tests.hops.test_upstream import Clock, FakeTransport

PERIOD = 0.25


def watched(name: str, max_queue: int = 5, max_kv: float = 0.8, **cfg: Any) -> Backend:
    """A backend whose model server's load is read (a metrics_url)."""
    config = BackendConfig(
        name=name,
        url=f"http://{name}.test/v1",
        metrics_url=f"http://{name}.test/metrics",
        metrics_interval_ms=PERIOD * 1000,
        max_queue=max_queue,
        max_kv_cache=max_kv,
        **cfg,
    )
    return Backend(config, FakeTransport([200]), environ={})  # type: ignore[arg-type]


def plain(name: str) -> Backend:
    config = BackendConfig(name=name, url=f"http://{name}.test/v1")
    return Backend(config, FakeTransport([200]), environ={})  # type: ignore[arg-type]


def fleet(*backends: Backend, clock: Clock | None = None, **route_cfg: Any):
    config = RouteConfig(models=("*",), backends=tuple(b.name for b in backends), **route_cfg)
    r = Route(config, backends)
    health = Health(backends, (r,), clock=clock or Clock(), rng=random.Random(3))
    return health, r.backends


def load(
    health: Health,
    b: Backend,
    queue: float = 0,
    kv: float | None = 0.0,
    running: float | None = 0,
) -> None:
    """Publish what a scrape of ``b``'s server would have said now."""
    cfg = b.config
    now = health._clock()
    saturated = queue >= cfg.max_queue or (kv is not None and kv >= cfg.max_kv_cache)
    health.publish(b, Load(queue, running, kv, saturated, now, now + STALE_PERIODS * PERIOD))


def names(order: Any) -> list[str]:
    return [b.name for b in order]


def firsts(health: Health, backends: tuple[Backend, ...], n: int = 200) -> Counter[str]:
    return Counter(health.order(backends)[0].name for _ in range(n))


def begin(health: Health, b: Backend) -> Attempt:
    attempt = Attempt(b, 1, 0)
    health.begin(attempt, False)
    return attempt


# ---------------------------------------------------------------- least_loaded


def test_least_loaded_follows_the_queue_then_the_kv_cache_then_in_flight():
    a, b, c = watched("a", max_queue=100), watched("b", max_queue=100), watched("c", 100)
    health, backends = fleet(a, b, c, strategy="least_loaded")
    load(health, a, queue=3, kv=0.1)
    load(health, b, queue=1, kv=0.7)
    load(health, c, queue=1, kv=0.2)
    assert names(health.order(backends)) == ["c", "b", "a"]
    load(health, c, queue=1, kv=0.7)  # b and c alike: this gateway's in-flight decides
    begin(health, c)
    load(health, b, queue=1, kv=0.7)
    load(health, c, queue=1, kv=0.7)
    begin(health, c)  # sent after the scrape: counts as c's queue too
    assert names(health.order(backends)) == ["b", "c", "a"]


def test_least_loaded_flips_when_the_load_flips():
    a, b = watched("a", max_queue=100), watched("b", max_queue=100)
    health, backends = fleet(a, b, strategy="least_loaded")
    load(health, a, queue=0)
    load(health, b, queue=4)
    assert firsts(health, backends) == {"a": 200}
    load(health, a, queue=6)
    load(health, b, queue=2)
    assert firsts(health, backends) == {"b": 200}


def test_requests_sent_since_the_scrape_count_so_a_burst_does_not_herd():
    a, b = watched("a", max_queue=100, max_kv=1.0), watched("b", max_queue=100, max_kv=1.0)
    health, backends = fleet(a, b, strategy="least_loaded")
    load(health, a, queue=0, running=2, kv=0.5)  # 0.25 of KV-cache per request: 4 at once
    load(health, b, queue=0, running=1, kv=0.4)  # 0.4 per request: 2.5 at once
    picks = []
    for _ in range(5):  # one scrape period's requests, all in flight
        first = health.order(backends)[0]
        begin(health, first)
        picks.append(first.name)
    # each to the one it fills least, (held + 1) / capacity: a 3/4 < b 2/2.5; b 0.8 < a 1;
    # then both full, to the shorter wait: a 5/4 < b 3/2.5, b 3/2.5 < a 6/4, a 6/4 < b 4/2.5
    assert picks == ["a", "b", "a", "b", "a"]


def sized(health: Health, b: Backend, slots: int) -> None:
    """Scrapes that teach ``b``'s size (a mock of ``slots`` slots, one running), then an idle
    one: what a model server that has served before and is idle now says."""
    load(health, b, queue=0, running=1, kv=1 / slots)
    load(health, b, queue=0, running=0, kv=0.0)


def burst(health: Health, backends: tuple[Backend, ...], n: int) -> list[str]:
    picks = []
    for _ in range(n):
        first = health.order(backends)[0]
        begin(health, first)
        picks.append(first.name)
    return picks


def test_a_burst_onto_an_idle_one_slot_backend_spreads_by_room():
    big, small = watched("big", max_queue=100), watched("small", max_queue=100)
    health, backends = fleet(big, small, strategy="least_loaded")
    sized(health, big, 4)
    sized(health, small, 1)  # both idle at the last scrape: KV-cache 0.0 alike
    # before any scrape says so, the requests sent fill big's four slots and small's one —
    # not every other request onto the one-slot server because it looked as empty
    picks = burst(health, backends, 5)
    assert Counter(picks) == {"big": 4, "small": 1}, picks
    assert picks[:3] == ["big", "big", "big"]  # the first go where the most room is
    # and the sixth waits where the wait is shorter: behind 1 of 4 slots, not 1 of 1
    assert health.order(backends)[0] is big


def test_a_request_that_ended_between_the_scrape_and_here_does_not_free_a_slot_twice():
    big, small = watched("big", max_queue=100), watched("small", max_queue=100)
    health, backends = fleet(big, small, strategy="least_loaded")
    sized(health, big, 4)
    sized(health, small, 1)
    first = begin(health, small)
    for _ in range(3):
        begin(health, big)
    # the server finished ``first`` just before this scrape; here it ends just after it
    load(health, small, queue=0, running=0, kv=0.0)
    load(health, big, queue=0, running=3, kv=0.75)
    health.settle(first, SUCCESS)
    assert burst(health, backends, 1) == ["small"]  # its one slot, once
    # the scrape's 0 and the end counted here would make it -1 + 1: it holds the one just sent
    assert burst(health, backends, 1) == ["big"]


def test_saturation_is_judged_on_the_estimate_not_the_stale_scrape():
    small, big = watched("small"), watched("big")  # ordered: small first while it has room
    health, backends = fleet(small, big)
    sized(health, small, 1)
    sized(health, big, 4)
    assert names(health.order(backends)) == ["small", "big"]
    begin(health, small)  # its one slot taken since the scrape: KV-cache 1.0 ≥ 0.8
    assert names(health.order(backends)) == ["big", "small"]
    assert health.load_gauges()["gateway_backend_saturated"] == {("small",): 1.0, ("big",): 0.0}
    assert health.snapshot()["small"]["load"]["saturated"] is True


def test_each_replica_leaves_room_for_the_others():
    clock = Clock()
    big, small = watched("big", max_queue=100), watched("small", max_queue=100)
    health, backends = fleet(big, small, clock=clock, strategy="least_loaded")
    sized(health, small, 1)
    held = [begin(health, big) for _ in range(2)]
    for _ in range(4):  # the server held 4 while this gateway had 2 there: another sends too
        load(health, big, queue=0, running=4, kv=1.0)
    for a in held:
        health.settle(a, SUCCESS)
    load(health, big, queue=0, running=0, kv=0.0)  # idle now; the other replica's share: half
    scorer = health._scorer
    assert scorer.capacity(big) == 4.0
    begin(health, big)
    est = scorer.estimate(big, clock())
    assert est is not None and est.fill is not None
    # one sent from here counts as two on a server two replicas share: 2 held of 4
    assert est.fill == pytest.approx(3 / 4) and est.kv == pytest.approx(0.5)
    # so the next fills big to 4 (as far as this replica can tell), and the one after that
    # goes to small's free slot — counted alone, big would have looked half empty
    assert burst(health, backends, 2) == ["big", "small"]


def test_what_ends_here_frees_one_slot_each_and_a_queue_takes_it():
    clock = Clock()
    a, b = watched("a", max_queue=100), watched("b", max_queue=100)
    health, _ = fleet(a, b, clock=clock, strategy="least_loaded")
    mine = [begin(health, a) for _ in range(2)]
    for _ in range(4):  # it held 4 running and 1 waiting, 2 of them this gateway's
        load(health, a, queue=1, running=4, kv=1.0)
    scorer = health._scorer
    assert scorer.capacity(a) == 4.0 and health._scorer._known[a].fleet_factor() > 2
    health.settle(mine[0], SUCCESS)
    est = scorer.estimate(a, clock())
    # one slot freed, and the request waiting there took it: full, not one free (nor two)
    assert est is not None and est.queue == 0.0 and est.fill == pytest.approx(5 / 4)


def test_the_capacity_a_server_states_and_its_kv_blocks_are_used():
    sg, v0, v1 = watched("sg", max_queue=100), watched("v0", 100), watched("v1", 100)
    health, _ = fleet(sg, v0, v1, strategy="least_loaded")
    scorer = health._scorer
    now = health._clock()
    until = now + STALE_PERIODS * PERIOD
    health.publish(sg, Load(0, 0, 0.0, False, now, until, capacity=8))  # SGLang says 8
    assert scorer.capacity(sg) == 8.0
    assert scorer.capacity(v1) is None  # idle and silent about its size
    # v0 ran 4 requests in 2000 of its blocks (500 each): v1's 1000 blocks hold 2
    health.publish(v0, Load(0, 4, 0.5, False, now, until, blocks=4000))
    health.publish(v1, Load(0, 0, 0.0, False, now, until, blocks=1000))
    assert scorer.capacity(v0) == pytest.approx(8.0)
    assert scorer.capacity(v1) == pytest.approx(2.0)
    # a server that queues shows what it runs at once
    health.publish(sg, Load(3, 6, 0.4, False, now, until, capacity=8))
    assert scorer.capacity(sg) == pytest.approx(6.0)


def test_among_many_with_room_the_better_of_two_at_random_goes_first():
    bs = [watched(n, max_queue=100) for n in "abcde"]
    health, backends = fleet(*bs, strategy="least_loaded")
    for b, running in zip(bs, (1, 2, 3, 3, 4), strict=True):
        load(health, b, queue=0, running=running, kv=running / 8)  # 8 slots each
    load(health, bs[4], queue=2, running=8, kv=1.0)  # e queues: never first while others don't
    seen = firsts(health, backends, 600)
    assert "e" not in seen
    # a global sort would send all to a; two choices send a half to a, and the rest to the
    # better of the other pair drawn — never to e, and to c or d only when both were drawn
    assert seen.keys() == {"a", "b", "c", "d"}
    assert seen["a"] > seen["b"] > seen["c"] + seen["d"]
    assert names(health.order(backends))[-1] == "e"


def test_a_queueing_backend_queues_what_is_sent_to_it():
    a, b = watched("a", max_queue=100), watched("b", max_queue=100)
    health, backends = fleet(a, b, strategy="least_loaded")
    load(health, a, queue=1, running=4, kv=0.5)
    load(health, b, queue=3, running=4, kv=0.5)
    picks = []
    for _ in range(4):
        first = health.order(backends)[0]
        begin(health, first)
        picks.append(first.name)
    assert picks[:2] == ["a", "a"] and Counter(picks) == {"a": 3, "b": 1}


def test_without_known_load_least_loaded_is_least_outstanding():
    a, b = watched("a"), plain("b")
    health, backends = fleet(a, b, strategy="least_loaded")  # a never scraped, b no metrics
    begin(health, a)
    assert names(health.order(backends)) == ["b", "a"]
    begin(health, b)
    begin(health, b)
    assert names(health.order(backends)) == ["a", "b"]
    ties = LeastLoaded(lambda _b: (0.0, 0.0, 0.0, 0), random.Random(1))
    assert {ties.order((a, b))[0].name for _ in range(50)} == {"a", "b"}  # ties at random


def test_stale_load_is_unknown():
    clock = Clock()
    a, b = watched("a", max_queue=100), watched("b", max_queue=100)
    health, backends = fleet(a, b, clock=clock, strategy="least_loaded")
    load(health, a, queue=9)
    load(health, b, queue=0)
    begin(health, b)
    begin(health, b)
    assert health.order(backends)[0] is b
    clock.now += STALE_PERIODS * PERIOD  # three periods without a scrape: unknown
    assert health.load(a) is None and health.order(backends)[0] is a  # by in-flight alone


def test_a_failed_scrape_makes_the_load_unknown_at_once():
    a, b = watched("a"), watched("b")
    health, backends = fleet(a, b)
    load(health, a, queue=9)  # saturated
    assert names(health.order(backends)) == ["b", "a"]
    health.publish(a, None)
    assert health.load(a) is None and names(health.order(backends)) == ["a", "b"]


# ---------------------------------------------------------------- saturation, every strategy


@pytest.mark.parametrize(
    "strategy",
    [
        {"strategy": "ordered"},
        {"strategy": "weighted", "weights": (9.0, 1.0, 1.0)},
        {"strategy": "least_outstanding"},
        {"strategy": "least_loaded"},
    ],
    ids=lambda s: s["strategy"],
)
def test_a_saturated_backend_is_skipped_under_every_strategy(strategy):
    a, b, c = watched("a", max_queue=3), watched("b", max_kv=0.9), watched("c")
    health, backends = fleet(a, b, c, **strategy)
    load(health, a, queue=3)  # queue at max_queue
    load(health, b, queue=0, kv=0.95)  # KV-cache beyond max_kv_cache
    load(health, c, queue=1, kv=0.5)
    assert firsts(health, backends) == {"c": 200}
    # the saturated are the last fallbacks, the least loaded first
    assert names(health.order(backends)) == ["c", "b", "a"]
    load(health, a, queue=0, kv=0.1)  # a recovers: the strategy has it again
    recovered = firsts(health, backends)
    assert recovered.keys() <= {"a", "c"} and "a" in recovered


def test_saturation_skipping_does_not_touch_routes_without_load():
    a, b = plain("a"), plain("b")
    health, backends = fleet(a, b)
    assert health.route(backends) is not None and not health.route(backends).fleet  # type: ignore[union-attr]
    assert names(health.order(backends)) == ["a", "b"]


def test_when_every_backend_is_saturated_the_least_loaded_gets_the_request():
    a, b, c = watched("a"), watched("b"), watched("c")
    health, backends = fleet(a, b, c)  # ordered
    load(health, a, queue=9)
    load(health, b, queue=6)
    load(health, c, queue=7)
    assert names(health.order(backends)) == ["b", "c", "a"]


def test_shedding_when_every_backend_is_saturated():
    a, b = watched("a"), watched("b")
    health, backends = fleet(a, b, shed_when_saturated=True)
    load(health, a, queue=5)
    load(health, b, kv=0.8)
    with pytest.raises(BackendSaturated) as err:
        health.order(backends)
    exc = err.value
    assert (exc.status, exc.type, exc.code) == (503, "upstream_error", "backend_saturated")
    assert (b"retry-after", b"1") in exc.headers and exc.should_retry
    load(health, b, kv=0.5)  # one frees up: it takes the request
    assert names(health.order(backends)) == ["b", "a"]


def test_ejection_and_saturation_together():
    a, b, c = watched("a", eject_after=1), watched("b"), watched("c")
    health, backends = fleet(a, b, c, shed_when_saturated=True)
    load(health, b, queue=5)
    health.settle(begin(health, a), CONNECTION_FAILED)  # a ejected
    assert names(health.order(backends)) == ["c", "b"]
    load(health, c, queue=5)
    with pytest.raises(BackendSaturated):  # all in rotation saturated
        health.order(backends)
