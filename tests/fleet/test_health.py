"""Passive health per (backend, model) pair (docs/spec.md §13), driven directly against the
fake transport of :mod:`tests.hops.test_upstream`: an answer's failure (5xx, 429 for a model)
counts against the pair, a connection's against the backend."""

from __future__ import annotations

import pytest

from gateway.context import Attempt
from gateway.errors import UpstreamConnectError, UpstreamStreamError
from gateway.fleet.health import (
    ANSWER_FAILED,
    CONNECTION_FAILED,
    MAX_MODELS_PER_BACKEND,
    SUCCESS,
    answer_outcome,
)
from tests.hops.test_upstream import (
    Clock,
    backend,
    calls,
    context,
    forward_once,
    no_backoff,  # noqa: F401 (the autouse fixture: backoff sleeps are zero here too)
    route,
    run,
    upstream_with,
)


def names(ctx) -> list[str]:
    return [x.backend.name for x in ctx.attempts]


def test_answer_outcomes():
    assert answer_outcome(500, "m") == answer_outcome(503, None) == ANSWER_FAILED
    assert answer_outcome(429, "m") == ANSWER_FAILED
    assert answer_outcome(429, None) == SUCCESS  # no model: about the request
    assert answer_outcome(400, "m") == answer_outcome(200, "m") == SUCCESS


def test_one_models_503s_eject_that_model_only():
    clock = Clock()
    a = backend("a", 503, eject_after=5)
    b = backend("b", 200)
    up, health = upstream_with(a, b, clock=clock)
    for _ in range(5):
        ctx, result = run(forward_once(up, (a, b), retries=0, model="A"))
        assert result == 200 and names(ctx) == ["a", "b"]
    # A is out on a; a itself stays up, and in rotation for B
    assert health.up("a")
    state = health.snapshot()["a"]
    assert state["state"] == "up" and state["ejections"] == 0
    assert state["models"] == {"A": "ejected"} and state["model_ejections"] == 1
    assert health.order((a, b), "A") == (b,)
    assert health.order((a, b), "B") == (a, b)
    assert health.order((a, b)) == (a, b)  # a request without a model
    a.transport.script = [200]  # type: ignore[attr-defined]
    ctx, result = run(forward_once(up, (a, b), retries=0, model="B"))
    assert result == 200 and names(ctx) == ["a"]
    before = calls(a)
    for _ in range(3):
        ctx, result = run(forward_once(up, (a, b), retries=0, model="A"))
        assert result == 200 and names(ctx) == ["b"]
    assert calls(a) == before


def test_429_for_a_model_counts_against_its_pair():
    a = backend("a", 429, eject_after=2)
    b = backend("b", 200)
    up, health = upstream_with(a, b)
    for _ in range(2):
        run(forward_once(up, (a, b), retries=0, model="A"))
    assert health.snapshot()["a"]["models"] == {"A": "ejected"} and health.up("a")
    # without a model a 429 is about the request: nothing counts
    for _ in range(3):
        _, result = run(forward_once(up, (a,), retries=0))
        assert result == 429
    assert health.snapshot()["a"]["consecutive_failures"] == 0 and health.up("a")


def test_connection_failures_eject_the_whole_backend():
    a = backend("a", UpstreamConnectError("refused"), eject_after=3)
    b = backend("b", 200)
    up, health = upstream_with(a, b)
    for model in ("A", "B", "C"):  # a different model each time: the backend is what failed
        ctx, result = run(forward_once(up, (a, b), retries=0, model=model))
        assert result == 200 and names(ctx) == ["a", "b"]
    assert not health.up("a")
    state = health.snapshot()["a"]
    assert state["state"] == "ejected" and state["ejections"] == 1 and state["models"] == {}
    for model in ("A", "B", "D", None):
        assert health.order((a, b), model) == (b,)


def test_a_stream_cut_after_the_answer_counts_against_the_backend():
    a = backend("a", 200, eject_after=2)
    up, health = upstream_with(a)

    async def cut(model: str) -> None:
        ctx = context()
        ctx.model = model
        resp, _ = await up.forward(ctx, (a,), b"{}")
        await resp.aclose()
        ctx.answer.error = UpstreamStreamError("upstream stream broke")
        health.finished(ctx)

    run(cut("A"))
    run(cut("B"))
    assert not health.up("a") and health.snapshot()["a"]["models"] == {}


def test_a_models_success_resets_its_count_and_keeps_no_pair():
    a = backend("a", 503, 503, 503, 503, 200, 503, eject_after=5)
    up, health = upstream_with(a)
    for _ in range(5):
        run(forward_once(up, (a,), retries=0, model="A"))
    # 4 failures, then a success: the count starts again, and the pair is gone
    assert health.snapshot()["a"]["models"] == {}
    assert not health._states[a].models  # memory: nothing kept for A
    run(forward_once(up, (a,), retries=0, model="A"))
    assert health._states[a].models["A"].consecutive == 1


def test_a_pair_is_probed_after_its_cool_down_one_probe_at_a_time():
    clock = Clock()
    a = backend("a", 503, eject_after=1, eject_for=5)
    b = backend("b", 200)
    up, health = upstream_with(a, b, clock=clock)
    run(forward_once(up, (a, b), retries=0, model="A"))
    assert health.order((a, b), "A") == (b,)
    clock.now += 6
    assert health.snapshot()["a"]["models"] == {"A": "probe_due"}
    assert health.order((a, b), "A") == (a, b)
    probe = Attempt(a, 1, 0)
    health.begin(probe, retry=False, model="A")
    assert health.snapshot()["a"]["models"] == {"A": "probing"}
    assert health.order((a, b), "A") == (b,)  # nobody else for A while the probe is out
    assert health.order((a, b), "B") == (a, b)  # B never stopped
    health.settle(probe, None, "A")  # the client left: no verdict, the probe is due again
    assert health.order((a, b), "A") == (a, b)
    # the probe fails: a new cool-down
    ctx, _ = run(forward_once(up, (a, b), retries=0, model="A"))
    assert names(ctx) == ["a", "b"]
    assert health.snapshot()["a"]["models"] == {"A": "ejected"}
    assert health.snapshot()["a"]["model_ejections"] == 2
    # after it, a probe that succeeds restores A on a
    clock.now += 6
    a.transport.script = [200]  # type: ignore[attr-defined]
    ctx, result = run(forward_once(up, (a, b), retries=0, model="A"))
    assert result == 200 and names(ctx) == ["a"]
    assert health.snapshot()["a"]["models"] == {}
    assert health.order((a, b), "A") == (a, b)


def test_a_connection_failure_says_nothing_about_a_pairs_probe():
    clock = Clock()
    a = backend("a", 503, eject_after=2, eject_for=5)
    up, health = upstream_with(a, backend("b"), clock=clock)
    for _ in range(2):
        run(forward_once(up, (a,), retries=0, model="A"))
    clock.now += 6
    probe = Attempt(a, 1, 0)
    health.begin(probe, retry=False, model="A")
    health.settle(probe, CONNECTION_FAILED, None)
    # the backend counted it; the pair is still due for its probe
    assert health.snapshot()["a"]["consecutive_failures"] == 1
    assert health.snapshot()["a"]["models"] == {"A": "probe_due"}


def test_an_answer_restores_a_backend_ejected_for_its_connection():
    clock = Clock()
    a = backend("a", UpstreamConnectError("refused"), eject_after=1, eject_for=5)
    up, health = upstream_with(a, backend("b"), clock=clock)
    run(forward_once(up, (a,), retries=0, model="A"))
    assert not health.up("a")
    clock.now += 6
    # the probe gets an answer: the connection works (the backend is back); the answer is
    # a 503 for A (the pair counts it)
    a.transport.script = [503]  # type: ignore[attr-defined]
    run(forward_once(up, (a,), retries=0, model="A"))
    assert health.up("a")
    assert health.snapshot()["a"]["models"] == {"A": "ejected"}


def test_the_failure_that_ejects_a_pair_is_not_retried_there():
    a = backend("a", 503, 503, 200, eject_after=2)
    b = backend("b", 200)
    up, health = upstream_with(a, b)
    ctx, result = run(forward_once(up, (a, b), retries=3, model="A"))
    # a's second 503 ejects A there: the retry goes to b, not a third time to a
    assert result == 200 and names(ctx) == ["a", "a", "b"]
    assert health.snapshot()["a"]["models"] == {"A": "ejected"}


def test_when_every_backend_is_out_for_a_model_the_least_recently_ejected_is_tried():
    clock = Clock()
    a = backend("a", 503, eject_after=1)
    b = backend("b", UpstreamConnectError("refused"), eject_after=1)
    up, health = upstream_with(a, b, clock=clock)
    run(forward_once(up, (a,), retries=0, model="A"))  # the pair (a, A) out
    clock.now += 1
    run(forward_once(up, (b,), retries=0, model="A"))  # b out
    assert health.order((a, b), "A") == (a,)
    assert health.order((a, b), "B") == (a,)  # a is in rotation for B; b is out for all
    a.transport.script = [200]  # type: ignore[attr-defined]
    ctx, result = run(forward_once(up, (a, b), retries=0, model="A"))
    assert result == 200 and names(ctx) == ["a"]  # a trial: it restores the pair
    assert health.snapshot()["a"]["models"] == {}


@pytest.mark.parametrize("strategy", ["ordered", "weighted", "least_outstanding"])
def test_every_strategy_skips_an_ejected_pair_for_its_model_only(strategy):
    a, b = backend("a", eject_after=1), backend("b")
    cfg = {"strategy": strategy}
    if strategy == "weighted":
        cfg["weights"] = (3, 1)
    r = route("r", (a, b), **cfg)
    _, health = upstream_with(a, b, routes=(r,))
    failing = Attempt(a, 1, 0)
    health.begin(failing, retry=False, model="A")
    health.settle(failing, ANSWER_FAILED, "A")
    firsts_a = {health.order(r.backends, "A")[0].name for _ in range(50)}
    firsts_b = {health.order(r.backends, "B")[0].name for _ in range(50)}
    assert firsts_a == {"b"}
    assert "a" in firsts_b


def test_the_pairs_a_backend_tracks_are_bounded_and_ejected_ones_are_kept():
    a = backend("a", 503, eject_after=2)
    up, health = upstream_with(a)
    for _ in range(2):
        run(forward_once(up, (a,), retries=0, model="kept"))
    assert health.snapshot()["a"]["models"] == {"kept": "ejected"}
    # clients choose model names: thousands of failing ones keep the table at its bound
    for i in range(MAX_MODELS_PER_BACKEND + 300):
        run(forward_once(up, (a,), retries=0, model=f"m{i}"))
    tracked = health._states[a].models
    assert len(tracked) == MAX_MODELS_PER_BACKEND
    assert health.snapshot()["a"]["models"] == {"kept": "ejected"}
    assert f"m{MAX_MODELS_PER_BACKEND + 299}" in tracked and "m0" not in tracked
