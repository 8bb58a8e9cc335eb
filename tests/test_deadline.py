"""The one deadline helper (gateway/deadline.py) on a real asyncio loop whose clock moves only
when a test says so: what expires, and how many timer handles it takes (no sleeps, no timing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.deadline import Deadline


class ClockLoop(asyncio.SelectorEventLoop):
    """asyncio's own loop and scheduler with a hand-moved clock; counts the timers armed."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.timers = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        self.timers += 1
        return super().call_at(when, callback, *args, **kw)

    def advance(self, seconds: float) -> None:
        """Move the clock, then let the loop run what became due (and what that scheduled)."""
        self.now += seconds
        for _ in range(3):
            self.run_until_complete(asyncio.sleep(0))

    def pending_timers(self) -> int:
        return sum(1 for h in self._scheduled if not h.cancelled())  # type: ignore[attr-defined]


@pytest.fixture
def loop() -> Iterator[ClockLoop]:
    loop = ClockLoop()
    yield loop
    loop.close()


def deadline(loop: ClockLoop, timeout: float = 1.0) -> tuple[Deadline, list[float]]:
    expired: list[float] = []
    return Deadline(loop, timeout, lambda: expired.append(loop.now)), expired


def test_a_stretch_that_keeps_starting_again_never_expires_on_few_timers(loop):
    d, expired = deadline(loop)
    d.start()
    for _ in range(100):  # a chunk every 0.1 s for 10 s, timeout 1 s
        loop.advance(0.1)
        d.touch()
    assert expired == [] and not d.expired
    # one timer, set again only when it fired early: about once per timeout, not per chunk
    assert loop.timers <= 15  # 10 s of chunks, 100 of them
    loop.advance(0.5)
    assert expired == []
    loop.advance(0.6)  # 1.1 s since the last chunk
    assert expired == [loop.now] and d.expired
    assert d.since is None and loop.pending_timers() == 0
    loop.advance(5)
    assert len(expired) == 1  # once


def test_stretches_that_end_reuse_the_armed_timer(loop):
    d, expired = deadline(loop)
    for _ in range(50):  # e.g. the head wait of one request after another on a connection
        d.start()
        loop.advance(0.05)
        d.end()
    assert loop.timers <= 4 and expired == []
    loop.advance(2)  # the timer fires with no stretch in progress: dropped, nothing expires
    assert expired == [] and loop.pending_timers() == 0
    d.start()  # the next stretch arms it again
    assert loop.pending_timers() == 1
    loop.advance(1.0)
    assert len(expired) == 1


def test_a_stretch_that_began_unarmed_expires_only_once_armed(loop):
    d, expired = deadline(loop)
    d.begin()  # a request head began; the read had all of it: nothing armed
    loop.advance(5)
    assert expired == [] and loop.timers == 0
    d.begin()
    loop.advance(0.4)
    d.arm()  # a read left the head unfinished: due a second after it began
    d.arm()  # armed once only
    assert loop.timers == 1
    loop.advance(0.5)
    assert expired == []
    loop.advance(0.2)
    assert len(expired) == 1


def test_stop_cancels_and_a_new_timeout_applies_to_the_next_stretch(loop):
    d, expired = deadline(loop, timeout=10)
    d.start()
    d.stop()
    assert loop.pending_timers() == 0
    d.timeout = 1.0  # e.g. the client guards: from the head's timeout to the body's
    d.start()
    loop.advance(1.1)
    assert len(expired) == 1
