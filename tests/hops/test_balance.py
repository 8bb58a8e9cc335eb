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
from gateway.hops.balance import LeastLoaded
from gateway.hops.fleet import STALE_PERIODS, Load
from gateway.hops.health import CONNECTION_FAILED, Health
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
    load(health, a, queue=0, running=2, kv=0.5)  # 0.25 of KV-cache per request
    load(health, b, queue=0, running=1, kv=0.4)  # 0.4 per request
    picks = []
    for _ in range(5):  # one scrape period's requests, all in flight
        first = health.order(backends)[0]
        begin(health, first)
        picks.append(first.name)
    # b (0.4), then a (0.5 -> 0.75), a (0.75 < 0.8), b (0.8 < 1.0), a: in proportion to room
    assert picks == ["b", "a", "a", "b", "a"]


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
    ties = LeastLoaded(lambda _b: (0.0, 0.0, 0), random.Random(1))
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
