"""A circuit breaker, so a dead or black-holed Redis costs requests no wait (docs/spec.md §10).

::

    closed ──(``failures`` consecutive failures)──► open ──(``reset_s`` elapsed)──► half_open
      ▲                                               ▲                                │
      └──────────── probe succeeded ──────────────────┼──────── probe failed ──────────┘

While open, :meth:`CircuitBreaker.allow` answers False at once (no network). Half-open lets
exactly one probe through at a time; every other caller is refused until the probe reports.
A probe that ends without a verdict (its task was cancelled) calls :meth:`release`, so the
next caller probes instead: the breaker can never stick in half-open.

>>> t = [0.0]
>>> b = CircuitBreaker(failures=2, reset_s=5.0, clock=lambda: t[0])
>>> b.failure(); b.failure(); b.state
'open'
>>> b.allow()
False
>>> t[0] = 5.0
>>> b.allow(), b.allow(), b.state      # one probe at a time
(True, False, 'half_open')
>>> b.success(); b.state
'closed'
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Literal

BreakerState = Literal["closed", "open", "half_open"]

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"


class CircuitBreaker:
    __slots__ = ("_clock", "_failures", "_opened_at", "_probing", "_state", "failures", "reset_s")

    def __init__(
        self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        if reset_s < 0:
            raise ValueError("reset_s must be >= 0")
        self.failures = failures
        self.reset_s = reset_s
        self._clock = clock
        self._state: BreakerState = CLOSED
        self._failures = 0  # consecutive, while closed
        self._opened_at = 0.0
        self._probing = False  # half-open: the one probe is in flight

    @property
    def state(self) -> BreakerState:
        """The state as of now (an open breaker whose timer ran out reads ``half_open``)."""
        if self._state == OPEN and self._clock() - self._opened_at >= self.reset_s:
            return HALF_OPEN
        return self._state

    def allow(self) -> bool:
        """May a call go out now? A True in half-open makes the caller the probe.

        Every True must be followed by exactly one of :meth:`success`, :meth:`failure`
        or :meth:`release`.
        """
        state = self._state
        if state == CLOSED:
            return True
        if state == OPEN:
            if self._clock() - self._opened_at < self.reset_s:
                return False
            self._state = HALF_OPEN
        if self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        if self._state == CLOSED:
            self._failures = 0
        elif self._state == HALF_OPEN and self._probing:
            self._close()
        # open: a call let through before the breaker opened; the timer decides, not it

    def failure(self) -> None:
        if self._state == CLOSED:
            self._failures += 1
            if self._failures >= self.failures:
                self._open()
        elif self._state == HALF_OPEN and self._probing:
            self._open()  # the timer restarts
        # open: a straggler from before the breaker opened; it must not extend the timer

    def release(self) -> None:
        """The call ended without a verdict (cancelled): free the probe slot."""
        if self._state == HALF_OPEN:
            self._probing = False

    def _open(self) -> None:
        self._state = OPEN
        self._opened_at = self._clock()
        self._probing = False
        self._failures = 0

    def _close(self) -> None:
        self._state = CLOSED
        self._probing = False
        self._failures = 0

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.state} failures={self._failures}/{self.failures}>"
