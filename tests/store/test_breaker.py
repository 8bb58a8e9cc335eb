"""The circuit breaker's state machine, on a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.store.breaker import CircuitBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(failures: int = 3, reset_s: float = 5.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(failures, reset_s, clock=clock), clock


def fail(b: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        assert b.allow()
        b.failure()


def test_closed_until_consecutive_failures() -> None:
    b, _ = make(failures=3)
    assert b.state == "closed"
    fail(b, 2)
    assert b.state == "closed" and b.allow()
    b.success()  # not consecutive any more
    fail(b, 2)
    assert b.state == "closed"
    fail(b, 1)
    assert b.state == "open"


def test_open_fails_fast_until_reset() -> None:
    b, clock = make(failures=1, reset_s=5.0)
    fail(b, 1)
    for _ in range(10):
        assert not b.allow()
    clock.now += 4.999
    assert not b.allow() and b.state == "open"
    clock.now += 0.001
    assert b.state == "half_open"


def test_half_open_lets_one_probe_through_and_success_closes() -> None:
    b, clock = make(failures=1, reset_s=5.0)
    fail(b, 1)
    clock.now += 5
    assert b.allow()  # the probe
    assert not b.allow() and not b.allow()  # everyone else fails fast meanwhile
    assert b.state == "half_open"
    b.success()
    assert b.state == "closed"
    assert all(b.allow() for _ in range(5))


def test_probe_failure_reopens_and_restarts_timer() -> None:
    b, clock = make(failures=3, reset_s=5.0)
    fail(b, 3)
    clock.now += 7
    assert b.allow()
    b.failure()
    assert b.state == "open"
    clock.now += 4.9  # timed from the probe's failure, not the first opening
    assert not b.allow()
    clock.now += 0.1
    assert b.allow()
    b.success()
    assert b.state == "closed"
    fail(b, 2)  # the failure count started afresh
    assert b.state == "closed"


def test_release_frees_the_probe_slot() -> None:
    b, clock = make(failures=1, reset_s=1.0)
    fail(b, 1)
    clock.now += 1
    assert b.allow()
    assert not b.allow()
    b.release()  # the probe was cancelled: no verdict
    assert b.state == "half_open"
    assert b.allow()
    b.success()
    assert b.state == "closed"


def test_stragglers_do_not_move_an_open_breaker() -> None:
    b, clock = make(failures=2, reset_s=5.0)
    assert b.allow() and b.allow() and b.allow()  # three calls out while closed
    b.failure()
    b.failure()
    assert b.state == "open"
    clock.now += 3
    b.success()  # the third answers late: the timer decides, not it
    assert b.state == "open"
    b.failure()  # nor does a late failure extend the timer
    clock.now += 2
    assert b.state == "half_open"


def test_release_while_closed_is_harmless() -> None:
    b, _ = make(failures=1)
    assert b.allow()
    b.release()
    assert b.state == "closed" and b.allow()


@pytest.mark.parametrize(("failures", "reset_s"), [(0, 1.0), (-1, 1.0), (1, -0.5)])
def test_invalid_settings(failures: int, reset_s: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        CircuitBreaker(failures, reset_s)


ops = st.lists(st.sampled_from(["call_ok", "call_fail", "call_cancel", "tick"]), max_size=60)


@given(ops, st.integers(1, 4))
def test_never_two_probes_and_open_means_no_calls(sequence: list[str], failures: int) -> None:
    """Random traffic: while open (before reset_s) nothing goes out; half-open admits one."""
    b, clock = make(failures=failures, reset_s=2.0)
    for op in sequence:
        if op == "tick":
            clock.now += 0.7
            continue
        state = b.state
        allowed = b.allow()
        if state == "open":
            assert not allowed
        if state == "closed":
            assert allowed
        if not allowed:
            continue
        if b.state == "half_open":
            assert not b.allow()  # a second caller is refused while the probe is out
        {"call_ok": b.success, "call_fail": b.failure, "call_cancel": b.release}[op]()
