"""Outlier ejection on its own (docs/spec.md §13): the transitions of :class:`Ejector` over a
backend and its (backend, model) pairs, driven directly — no route, no strategy, no request
(through the upstream hop: test_health.py, test_upstream.py)."""

from __future__ import annotations

from gateway.fleet.ejection import (
    ANSWER_FAILED,
    CONNECTION_FAILED,
    SUCCESS,
    BackendRotation,
    Ejector,
)
from tests.hops.test_upstream import Clock, backend


def setup(eject_after: int = 2, eject_for: float = 30.0):
    clock = Clock()
    state = BackendRotation(backend("a", eject_after=eject_after, eject_for=eject_for))
    return clock, state, Ejector(["a"], clock)


def test_consecutive_connection_failures_eject_and_the_probe_decides():
    clock, state, ejector = setup()
    ejector.settle(state, CONNECTION_FAILED, "m", False, None)
    ejector.settle(state, SUCCESS, "m", False, None)  # a success resets the count
    ejector.settle(state, CONNECTION_FAILED, "m", False, None)
    assert state.state(clock()) == "up" and ejector.out == 0
    ejector.settle(state, CONNECTION_FAILED, "m", False, None)
    assert state.state(clock()) == "ejected" and ejector.out == 1
    assert ejector.ejections == {"a": 1} and not state.available(clock())
    # an attempt in flight before the ejection says nothing new
    ejector.settle(state, SUCCESS, "m", False, None)
    assert state.until is not None
    clock.now += 30
    assert state.state(clock()) == "probe_due" and state.available(clock())
    ejector.settle(state, CONNECTION_FAILED, "m", True, None)  # the probe failed: out again
    assert ejector.ejections == {"a": 2} and state.until == clock() + 30
    clock.now += 30
    ejector.settle(state, SUCCESS, "m", True, None)  # the next probe succeeded: back
    assert state.state(clock()) == "up" and ejector.out == 0


def test_an_answers_failure_ejects_the_pair_and_leaves_the_backend_up():
    clock, state, ejector = setup()
    for _ in range(2):
        ejector.settle(state, ANSWER_FAILED, "m", False, None)
    assert state.until is None and state.pairs_out == 1 and ejector.out == 1
    assert ejector.model_ejections == {"a": 1} and ejector.ejections == {"a": 0}
    assert not state.available_for("m", clock()) and state.available_for("other", clock())
    assert state.back_at("m") == clock() + 30 and state.pair_out("m") is state.models["m"]
    clock.now += 30
    pair = state.models["m"]
    ejector.settle(state, SUCCESS, "m", False, pair)  # its probe: back, and no pair is kept
    assert not state.models and state.pairs_out == 0 and ejector.out == 0


def test_eject_after_zero_never_ejects_and_a_model_less_5xx_counts_for_the_backend():
    _, state, ejector = setup(eject_after=0)
    for _ in range(10):
        ejector.settle(state, CONNECTION_FAILED, "m", False, None)
    assert state.until is None and ejector.out == 0
    _, state, ejector = setup()
    for _ in range(2):
        ejector.settle(state, ANSWER_FAILED, None, False, None)  # passthrough: no pair
    assert state.until is not None and not state.models and ejector.ejections == {"a": 1}
