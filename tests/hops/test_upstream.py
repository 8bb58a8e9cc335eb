"""The upstream hop, passive health, the retry budget and the strategies, driven directly
against a fake transport (no sockets): what each attempt is, where it goes, what counts."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import gateway.attempts as attempts_mod
from gateway.attempts import AttemptPlan
from gateway.config import BackendConfig, EdgeConfig, RouteConfig
from gateway.context import Attempt, RequestContext
from gateway.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStreamError,
    UpstreamTimeout,
)
from gateway.fleet.balance import LeastOutstanding, Weighted
from gateway.fleet.health import BUDGET_FLOOR_PER_S, CONNECTION_FAILED, SUCCESS, Health, Window
from gateway.hops.edge import RequestEdge
from gateway.hops.upstream import Upstream
from gateway.routes import Backend, Route
from gateway.types import RawHeaders

# ---------------------------------------------------------------- fakes


class FakeResponse:
    def __init__(self, status: int, headers: RawHeaders | None = None) -> None:
        self.status = status
        self.headers: RawHeaders = headers or []
        self.closed = False

    def complete_body(self, limit: int) -> bytes | None:
        return None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield b"{}"

    async def aclose(self) -> None:
        self.closed = True


#: what a fake backend does for one request: a status (with optional headers) or an error
Outcome = int | tuple[int, RawHeaders] | GatewayError


class FakeTransport:
    """Answers from a script (the last entry repeats), recording every request."""

    def __init__(self, script: list[Outcome]) -> None:
        self.script = script
        self.calls = 0

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Any
    ) -> FakeResponse:
        outcome = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        await asyncio.sleep(0)
        if isinstance(outcome, GatewayError):
            raise outcome
        if isinstance(outcome, tuple):
            return FakeResponse(*outcome)
        return FakeResponse(outcome)

    async def aclose(self) -> None:
        pass


def backend(name: str, *script: Outcome, eject_after: int = 5, eject_for: float = 30.0) -> Backend:
    cfg = BackendConfig(
        name=name, url=f"http://{name}.test/v1", eject_after=eject_after, eject_for_s=eject_for
    )
    return Backend(cfg, FakeTransport(list(script) or [200]), environ={})  # type: ignore[arg-type]


def calls(b: Backend) -> int:
    transport = b.transport
    assert isinstance(transport, FakeTransport)
    return transport.calls


def context() -> RequestContext:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
    }
    return RequestEdge(EdgeConfig()).accept(scope)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff sleeps are real sleeps: make them zero (what is retried is the subject here)."""
    monkeypatch.setattr(attempts_mod, "backoff", lambda n: 0.0)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


async def forward_once(
    up: Upstream,
    backends: tuple[Backend, ...],
    retries: int = 2,
    model: str | None = None,
    **kw: Any,
) -> tuple[RequestContext, int | GatewayError]:
    """One request (for ``model``: None, a request without one) through ``forward``; the
    request then ends (the telemetry sink runs)."""
    ctx = context()
    ctx.model = model
    try:
        resp, _ = await up.forward(ctx, backends, b"{}", retries, **kw)
        result: int | GatewayError = resp.status
        await resp.aclose()
    except GatewayError as exc:
        result = exc
        ctx.answer.error = exc
    if up.health is not None:
        up.health.finished(ctx)
    return ctx, result


def upstream_with(*backends: Backend, routes: tuple[Route, ...] = (), clock: Clock | None = None):
    health = Health(backends, routes, clock=clock or Clock(), rng=random.Random(7))
    return Upstream(health=health), health


# ---------------------------------------------------------------- the plan


def test_attempt_plan_marks_retries_and_skips():
    plan = AttemptPlan(("a", "b"), tries=2)
    assert plan.next() == "a" and not plan.is_retry and plan.next_is_retry
    assert plan.next() == "a" and plan.is_retry and not plan.next_is_retry
    assert plan.next() == "b" and not plan.is_retry
    plan.skip_backend()
    assert not plan.more and plan.next() is None


# ---------------------------------------------------------------- what is retried


def test_connect_errors_and_503_are_retried_then_fall_back():
    a = backend("a", UpstreamConnectError("refused"), 503, 503)
    b = backend("b", 200)
    up, health = upstream_with(a, b)
    ctx, result = run(forward_once(up, (a, b), retries=2))
    assert result == 200
    assert [x.backend.name for x in ctx.attempts] == ["a", "a", "a", "b"]
    assert health.retries == {"a": 2, "b": 0}


def test_read_timeout_after_sending_is_not_retried_unless_the_route_says_so():
    a = backend("a", UpstreamTimeout("slow"), 200)
    up, _ = upstream_with(a)
    _, result = run(forward_once(up, (a,)))
    assert isinstance(result, UpstreamTimeout) and calls(a) == 1
    _, result = run(forward_once(up, (a,), retry_on_timeout=True))
    assert result == 200


def test_a_4xx_is_relayed_not_retried_and_never_counts_as_a_failure():
    a = backend("a", 400, eject_after=2)
    up, health = upstream_with(a)
    for _ in range(5):
        _, result = run(forward_once(up, (a,)))
        assert result == 400
    assert calls(a) == 5 and health.up("a") and health.ejections["a"] == 0


def test_retry_after_beyond_the_cap_moves_to_the_next_backend_at_once():
    a = backend("a", (429, [(b"retry-after", b"60")]))
    b = backend("b", 200)
    up, _ = upstream_with(a, b)
    ctx, result = run(forward_once(up, (a, b)))
    assert result == 200 and [x.backend.name for x in ctx.attempts] == ["a", "b"]


def test_redirects_are_refused():
    a = backend("a", (302, [(b"location", b"http://elsewhere/")]))
    up, health = upstream_with(a)
    _, result = run(forward_once(up, (a,)))
    assert isinstance(result, UpstreamError) and result.code == "upstream_redirect"
    assert health.outstanding("a") == 0


# ---------------------------------------------------------------- backoff (docs/spec.md §6)


@pytest.mark.parametrize(
    ("first", "planned"),
    [(503, 0.02), ((503, [(b"retry-after", b"0.05")]), 0.05)],
    ids=["backoff", "retry-after"],
)
def test_the_wait_between_attempts_is_booked_as_backoff(monkeypatch, first, planned):
    monkeypatch.setattr(attempts_mod, "backoff", lambda n: 0.02)
    a = backend("a", first, 200)
    up, _ = upstream_with(a)

    async def request() -> RequestContext:
        ctx, result = await forward_once(up, (a,), retries=1, model="m")
        assert result == 200
        return ctx

    ctx = run(request())
    first_try, second_try = ctx.attempts
    second_try.finished()  # the answer relayed (the relay stamps it), then the request ends
    ctx.timeline.done = time.perf_counter()
    backoff = ctx.timeline.backoff
    # the time asleep (never less than asked) lies between the two attempts, in neither
    assert backoff >= planned * 0.99
    assert first_try.end is not None
    assert first_try.end + backoff <= second_try.start + 1e-9
    # request = upstream + backoff + the gateway's own time, each part in its place
    request_s, upstream_s = ctx.request_time(), ctx.upstream_time()
    assert 0 < backoff <= request_s
    assert upstream_s + backoff <= request_s
    assert ctx.overhead() == pytest.approx(request_s - upstream_s - backoff)


def test_no_wait_no_backoff():
    a = backend("a", UpstreamConnectError("refused"))
    b = backend("b", (503, [(b"retry-after", b"60")]), 200)
    c = backend("c", 200)
    up, _ = upstream_with(a, b, c)
    # a fails (backoff 0 here), b asks for more patience than the cap: c at once
    ctx, result = run(forward_once(up, (a, b, c), retries=0))
    assert result == 200 and [x.backend.name for x in ctx.attempts] == ["a", "b", "c"]
    assert ctx.timeline.backoff == 0.0


# ---------------------------------------------------------------- pinned (docs/spec.md §22)


def test_a_pinned_request_goes_to_its_backend_even_ejected_and_nowhere_else():
    clock = Clock()
    a = backend("a", UpstreamConnectError("refused"), eject_after=1, eject_for=60)
    b = backend("b", 200)
    up, health = upstream_with(a, b, clock=clock)
    run(forward_once(up, (a, b), retries=0))
    assert not health.up("a")
    # not pinned: a is skipped
    ctx, result = run(forward_once(up, (a, b), retries=0))
    assert result == 200 and [x.backend.name for x in ctx.attempts] == ["b"]
    b_calls = calls(b)
    # pinned: a is tried although ejected; its error is the answer, b is never asked
    ctx, result = run(forward_once(up, (a, b), retries=2, pinned=True))
    assert isinstance(result, UpstreamConnectError)
    assert [x.backend.name for x in ctx.attempts] == ["a"]
    # its answer, an error answer too, passes through
    a.transport.script = [503]  # type: ignore[attr-defined]
    ctx, result = run(forward_once(up, (a, b), retries=2, pinned=True, model="m"))
    assert result == 503 and {x.backend.name for x in ctx.attempts} == {"a"}
    assert calls(b) == b_calls
    # and its success puts the backend back in rotation (a trial, like the probe)
    a.transport.script = [200]  # type: ignore[attr-defined]
    _, result = run(forward_once(up, (a,), pinned=True, model="m"))
    assert result == 200 and health.up("a")


def test_a_pinned_request_ignores_the_strategy_and_an_ejected_pair():
    a, b = backend("a", 503, eject_after=1, eject_for=60), backend("b", 200)
    r = route("w", (b, a), strategy="weighted", weights=(1000, 1))
    up, health = upstream_with(a, b, routes=(r,))
    run(forward_once(up, (a,), retries=0, model="m"))
    assert health.snapshot()["a"]["models"] == {"m": "ejected"}
    for _ in range(5):
        ctx, result = run(forward_once(up, (a, b), retries=0, model="m", pinned=True))
        assert result == 503 and [x.backend.name for x in ctx.attempts] == ["a"]
    assert calls(b) == 0


def test_a_pinned_request_is_retried_on_its_backend_within_its_budget():
    a, b = backend("a", 503, 200), backend("b", 200)
    up, health = upstream_with(a, b)
    ctx, result = run(forward_once(up, (a, b), retries=1, model="m", pinned=True))
    assert result == 200 and [x.backend.name for x in ctx.attempts] == ["a", "a"]
    assert health.retries["a"] == 1 and calls(b) == 0


# ---------------------------------------------------------------- passive health


def test_consecutive_failures_eject_then_one_probe_decides():
    clock = Clock()
    a = backend("a", UpstreamConnectError("refused"), eject_after=3, eject_for=30)
    b = backend("b", 200)
    up, health = upstream_with(a, b, clock=clock)
    run(forward_once(up, (a, b), retries=0))
    run(forward_once(up, (a, b), retries=0))
    assert health.up("a")
    run(forward_once(up, (a, b), retries=0))
    assert not health.up("a") and health.ejections["a"] == 1
    assert health.snapshot()["a"]["state"] == "ejected"
    before = calls(a)
    for _ in range(4):  # skipped by every request while ejected
        ctx, result = run(forward_once(up, (a, b), retries=0))
        assert result == 200 and [x.backend.name for x in ctx.attempts] == ["b"]
    assert calls(a) == before
    clock.now += 31  # the cool-down is over: the next request is the probe, and it fails
    ctx, _ = run(forward_once(up, (a, b), retries=0))
    assert [x.backend.name for x in ctx.attempts] == ["a", "b"]
    assert not health.up("a") and health.ejections["a"] == 2
    clock.now += 31
    a.transport.script = [200]  # type: ignore[attr-defined]
    ctx, result = run(forward_once(up, (a, b), retries=0))
    assert result == 200 and [x.backend.name for x in ctx.attempts] == ["a"]
    assert health.up("a") and health.snapshot()["a"]["state"] == "up"


def test_only_one_probe_at_a_time():
    clock = Clock()
    a = backend("a", 500, eject_after=1, eject_for=5)
    b = backend("b", 200)
    up, health = upstream_with(a, b, clock=clock)
    run(forward_once(up, (a, b), retries=0))
    assert not health.up("a")
    clock.now += 6
    assert health.order((a, b)) == (a, b)  # probe due
    probe = Attempt(a, 1, 0)
    health.begin(probe, retry=False)
    assert health.snapshot()["a"]["state"] == "probing"
    assert health.order((a, b)) == (b,)  # nobody else while the probe is out
    health.settle(probe, None)  # the client left: no verdict, the probe is due again
    assert health.order((a, b)) == (a, b)


def test_when_every_backend_is_ejected_the_least_recently_ejected_is_still_tried():
    clock = Clock()
    a = backend("a", 503, eject_after=1)
    b = backend("b", 503, eject_after=1)
    up, health = upstream_with(a, b, clock=clock)
    run(forward_once(up, (a,), retries=0))
    clock.now += 1
    run(forward_once(up, (b,), retries=0))
    assert not health.up("a") and not health.up("b")
    assert health.order((a, b)) == (a,)
    b.transport.script = [200]  # type: ignore[attr-defined]
    a.transport.script = [200]  # type: ignore[attr-defined]
    ctx, result = run(forward_once(up, (a, b), retries=0))
    assert result == 200 and [x.backend.name for x in ctx.attempts] == ["a"]
    assert health.up("a") and not health.up("b")  # a trial that succeeded restores it


def test_a_stream_cut_midway_is_a_failure_a_client_leaving_is_not():
    a = backend("a", 200, eject_after=2)
    up, health = upstream_with(a)

    async def relayed(cut: bool, gone: bool) -> None:
        ctx = context()
        resp, _ = await up.forward(ctx, (a,), b"{}")
        await resp.aclose()
        if cut:
            ctx.answer.error = UpstreamStreamError("upstream stream broke")
        ctx.disconnected = gone
        health.finished(ctx)

    run(relayed(cut=True, gone=False))
    run(relayed(cut=False, gone=True))  # neutral: the count stays at 1
    assert health.snapshot()["a"]["consecutive_failures"] == 1
    run(relayed(cut=True, gone=False))
    assert not health.up("a")


def test_eject_after_zero_never_ejects():
    a = backend("a", 502, eject_after=0)
    up, health = upstream_with(a)
    for _ in range(20):
        run(forward_once(up, (a,), retries=0))
    assert health.up("a") and health.ejections["a"] == 0


def test_outstanding_counts_in_flight_attempts_and_returns_to_zero():
    a = backend("a", UpstreamConnectError("x"), 200)
    up, health = upstream_with(a)

    async def check() -> None:
        ctx = context()
        resp, _ = await up.forward(ctx, (a,), b"{}", 2)
        assert health.outstanding("a") == 1  # the failed attempt settled, the answer is open
        await resp.aclose()
        health.finished(ctx)
        assert health.outstanding("a") == 0

    run(check())


# ---------------------------------------------------------------- retry budget


def test_window_counts_the_last_ten_seconds():
    w = Window()
    for t in (0.5, 1.5, 1.6, 9.9):
        w.add(t)
    assert w.total(9.95) == 4 and w.this_second(1.7) == 2
    assert w.total(10.5) == 3  # second 0 has left the window
    assert w.total(11.0) == 1  # and second 1
    assert w.total(30.0) == 0


def test_the_budget_stops_a_retry_storm_and_counts_it():
    clock = Clock()
    a = backend("a", 503, eject_after=0)
    up, health = upstream_with(a, clock=clock)

    async def storm() -> None:
        await asyncio.gather(*(forward_once(up, (a,), retries=2) for _ in range(50)))

    run(storm())
    # 50 requests in one second: 20 % of them (10) beat the floor of 3 per second
    assert health.retries["a"] == 10
    assert calls(a) == 50 + 10
    # every request that wanted a retry and got none: 40 at once, the 10 retried ones after
    assert health.budget_exhausted["a"] == 50
    clock.now += 1  # the window now holds 100 requests: 20 retries in all
    run(storm())
    assert health.retries["a"] == 10 + 10


def test_the_floor_lets_a_quiet_backend_retry():
    clock = Clock()
    a = backend("a", 503, eject_after=0)
    up, health = upstream_with(a, clock=clock)
    for _ in range(5):
        clock.now += 1.0
        run(forward_once(up, (a,), retries=5))
    # one request per second: 20 % would allow none; the floor allows 3 retries per second
    assert health.retries["a"] == 5 * BUDGET_FLOOR_PER_S


def test_when_the_budget_is_spent_the_next_backend_is_still_tried():
    clock = Clock()
    a = backend("a", 503, eject_after=0)
    b = backend("b", 200)
    up, health = upstream_with(a, b, clock=clock)

    async def burst() -> list[Any]:
        return await asyncio.gather(*(forward_once(up, (a, b), retries=2) for _ in range(30)))

    results = run(burst())
    assert all(result == 200 for _, result in results)
    assert health.budget_exhausted["a"] > 0 and calls(b) == 30


# ---------------------------------------------------------------- strategies


def route(name: str, backends: tuple[Backend, ...], **cfg: Any) -> Route:
    config = RouteConfig(models=("*",), backends=tuple(b.name for b in backends), name=name, **cfg)
    return Route(config, backends)


def firsts(order: Callable[[], Any], n: int) -> Counter[str]:
    return Counter(order()[0].name for _ in range(n))


def test_weighted_is_smooth_and_exact_over_each_cycle():
    a, b = backend("a"), backend("b")
    w = Weighted((a, b), (3, 1))
    picks = "".join(w.order((a, b))[0].name for _ in range(8))
    assert picks == "aabaaaba"  # nginx's sequence: never a burst of one backend


def test_weighted_route_splits_3_to_1_and_skips_the_ejected():
    a, b, c = backend("a"), backend("b"), backend("c", eject_after=1)
    r = route("w", (a, b, c), strategy="weighted", weights=(3, 1, 4))
    _, health = upstream_with(a, b, c, routes=(r,))
    assert firsts(lambda: health.order(r.backends), 800) == {"a": 300, "b": 100, "c": 400}
    failing = Attempt(c, 1, 0)
    health.begin(failing, retry=False)
    health.settle(failing, CONNECTION_FAILED)
    assert firsts(lambda: health.order(r.backends), 800) == {"a": 600, "b": 200}


def test_least_outstanding_prefers_the_idle_backend_and_breaks_ties_at_random():
    a, b = backend("a"), backend("b")
    busy = {a: 3, b: 1}
    lo = LeastOutstanding(lambda x: busy[x], random.Random(1))
    assert [x.name for x in lo.order((a, b))] == ["b", "a"]
    busy[a] = 1
    ties = Counter(lo.order((a, b))[0].name for _ in range(1000))
    assert 400 < ties["a"] < 600


def test_least_outstanding_route_reads_in_flight_attempts():
    a, b = backend("a"), backend("b")
    r = route("lo", (a, b), strategy="least_outstanding")
    _, health = upstream_with(a, b, routes=(r,))
    held = [Attempt(a, 1, 0), Attempt(a, 1, 0)]
    for x in held:
        health.begin(x, retry=False)
    assert all(health.order(r.backends)[0] is b for _ in range(20))
    for x in held:
        health.settle(x, SUCCESS)
    assert firsts(lambda: health.order(r.backends), 200).keys() == {"a", "b"}


def test_ordered_is_the_configured_order_and_other_tuples_are_ordered_too():
    a, b = backend("a"), backend("b")
    r = route("o", (a, b))
    _, health = upstream_with(a, b, routes=(r,))
    assert health.order(r.backends) == (a, b)
    assert health.order((b, a)) == (b, a)
