"""Passive health (outlier ejection) and the retry budget, per backend, per process (SPEC §13).

What an attempt's outcome is (Envoy's ``consecutive_5xx`` with local-origin failures folded in):

=========  ===============================================================================
failure    the connection could not be made (refused, unreachable, DNS, connect timeout);
           the upstream reset or closed it, broke HTTP framing or timed out — before its
           answer or in the middle of its body (a stream cut, truncated or idle); or it
           answered 500-599
success    any other answer (2xx, 3xx, and every 4xx — 429 included: a 4xx is about the
           request, never the backend's health), counted when its body was relayed whole
neutral    the client went away, or the request was cancelled, before the outcome was known
=========  ===============================================================================

``eject_after`` consecutive failures (``0``: never) take the backend out of rotation for
``eject_for_s``. After the cool-down the next request that would use it is the probe — the
only one: until its outcome is known the backend takes no other traffic. Its success puts the
backend back; its failure starts a new cool-down (counted as another ejection). Every strategy
skips a backend out of rotation; when every backend of a route is out, the request still goes
to the one whose cool-down ends first (the least recently ejected) rather than failing
without trying — that attempt is a trial like the probe. Any attempt that reaches a backend out
of rotation (a request that chose it just before it was ejected, too) is such a trial; the
outcomes of attempts that were already in flight when the backend was ejected are ignored.

The retry budget: a retry — an attempt that sends the request again to the backend that just
failed it — is allowed while that backend's retries over the last 10 s stay under 20 % of its
requests (first attempts and fallbacks) over the same window, or while it has had fewer than 3
retries in the current second (the floor). Otherwise it is not sent, ``budget_exhausted`` is
counted, and the request goes on to the route's next backend if there is one (a fallback is a
new request for that backend, not a retry) or ends with the answer or error it has. A fallback
spreads load over the fleet; a retry is what hammers one failing backend.

What the lead's ``/metrics`` reads (all keyed by backend name): :meth:`Health.up`,
:attr:`Health.ejections`, :attr:`Health.retries`, :attr:`Health.budget_exhausted`, and
:meth:`Health.outstanding`; ``/readyz`` shows :meth:`Health.snapshot`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gateway.context import Attempt, RequestContext
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.hops.balance import Ordered, Strategy, make_strategy
from gateway.routes import Backend, Route

log = logging.getLogger("gateway")

#: the retry budget (Envoy's retry_budget, as a rate): window, share of requests, floor per s
BUDGET_WINDOW_S = 10
BUDGET_RATIO = 0.2
BUDGET_FLOOR_PER_S = 3


class Window:
    """Events counted in one-second buckets over the last :data:`BUDGET_WINDOW_S` seconds.

    >>> w = Window()
    >>> for t in (100.1, 100.5, 104.0):
    ...     w.add(t)
    >>> w.total(104.2), w.this_second(104.9), w.total(110.5)
    (3, 1, 1)
    """

    __slots__ = ("_counts", "_seconds")

    def __init__(self) -> None:
        self._counts = [0] * BUDGET_WINDOW_S
        self._seconds = [-1] * BUDGET_WINDOW_S

    def add(self, now: float) -> None:
        second = int(now)
        i = second % BUDGET_WINDOW_S
        if self._seconds[i] != second:
            self._seconds[i] = second
            self._counts[i] = 0
        self._counts[i] += 1

    def total(self, now: float) -> int:
        oldest = int(now) - BUDGET_WINDOW_S
        return sum(c for c, s in zip(self._counts, self._seconds, strict=True) if s > oldest)

    def this_second(self, now: float) -> int:
        second = int(now)
        i = second % BUDGET_WINDOW_S
        return self._counts[i] if self._seconds[i] == second else 0


class BackendHealth:
    """One backend's passive health in this process."""

    __slots__ = (
        "consecutive",
        "eject_after",
        "eject_for",
        "ejected_at",
        "name",
        "outstanding",
        "probes",
        "requests",
        "retries",
        "until",
    )

    def __init__(self, backend: Backend) -> None:
        self.name = backend.name
        self.eject_after = backend.config.eject_after
        self.eject_for = backend.config.eject_for_s
        self.consecutive = 0
        #: out of rotation until this monotonic time (None: in rotation)
        self.until: float | None = None
        self.ejected_at: float | None = None
        #: attempts that reached the backend while out of rotation (the probe, trials)
        self.probes: set[Attempt] = set()
        self.outstanding = 0
        self.requests = Window()
        self.retries = Window()

    def available(self, now: float) -> bool:
        """In rotation, or its cool-down is over and no probe is in flight."""
        until = self.until
        return until is None or (now >= until and not self.probes)

    def state(self, now: float) -> str:
        if self.until is None:
            return "up"
        if self.probes:
            return "probing"
        return "ejected" if now < self.until else "probe_due"

    def budget_allows(self, now: float) -> bool:
        retries = self.retries.total(now)
        return (
            retries < BUDGET_RATIO * self.requests.total(now)
            or self.retries.this_second(now) < BUDGET_FLOOR_PER_S
        )


class Health:
    """Passive health, the retry budget and the route strategies of one process."""

    def __init__(
        self,
        backends: Iterable[Backend],
        routes: Iterable[Route] = (),
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._clock = clock
        self._states: dict[Backend, BackendHealth] = {b: BackendHealth(b) for b in backends}
        self._by_name = {s.name: s for s in self._states.values()}
        names = list(self._by_name)
        self.ejections: dict[str, int] = dict.fromkeys(names, 0)
        #: retries sent (to the backend that had just failed the request)
        self.retries: dict[str, int] = dict.fromkeys(names, 0)
        #: retries not sent because the backend's budget was spent
        self.budget_exhausted: dict[str, int] = dict.fromkeys(names, 0)
        #: attempts begun and not settled yet, with their backend's state
        self._open: dict[Attempt, BackendHealth] = {}
        self._out = 0  # backends out of rotation: 0 keeps order() a lookup
        self._ordered = Ordered()
        # a route's backends tuple is made once (runtime) and passed by the pipeline as is;
        # any other tuple (passthrough's one backend) is in configured order
        self._strategies: dict[int, Strategy] = {
            id(r.backends): make_strategy(r.config, r.backends, self._outstanding_of, rng)
            for r in routes
        }

    # ------------------------------------------------------------ what others read

    def up(self, name: str) -> bool:
        """In rotation (``gateway_backend_up`` 1) or out of it (0: ejected or probing)."""
        return self._by_name[name].until is None

    def outstanding(self, name: str) -> int:
        """Attempts in flight on the backend (a stream counts until it ends)."""
        return self._by_name[name].outstanding

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per backend: state, counters, and seconds until the probe (for ``/readyz``)."""
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for name, s in self._by_name.items():
            row: dict[str, Any] = {
                "state": s.state(now),
                "up": s.until is None,
                "consecutive_failures": s.consecutive,
                "outstanding": s.outstanding,
                "ejections": self.ejections[name],
                "retries": self.retries[name],
                "budget_exhausted": self.budget_exhausted[name],
            }
            if s.until is not None:
                row["probe_in_s"] = round(max(0.0, s.until - now), 3)
            out[name] = row
        return out

    # ------------------------------------------------------------ the upstream hop's calls

    def order(self, backends: tuple[Backend, ...]) -> Sequence[Backend]:
        """The backends to try, in order: the route's strategy over those in rotation."""
        strategy = self._strategies.get(id(backends), self._ordered)
        if not self._out:
            return strategy.order(backends)
        now = self._clock()
        states = self._states
        available = tuple(b for b in backends if states[b].available(now))
        if available:
            return strategy.order(available)
        # every one is out: the one whose cool-down ends first, rather than no attempt at all
        return (min(backends, key=lambda b: states[b].until or 0.0),)

    def begin(self, attempt: Attempt, retry: bool) -> None:
        state = self._states[attempt.backend]
        state.outstanding += 1
        self._open[attempt] = state
        if not retry:
            state.requests.add(self._clock())
        if state.until is not None:
            state.probes.add(attempt)  # the probe, or a trial: its outcome decides

    def may_retry(self, backend: Backend) -> bool:
        """Whether the request may be sent to ``backend`` again (reserves the retry)."""
        state = self._states[backend]
        if state.until is not None:  # this failure ejected it: the next backend, if any
            return False
        now = self._clock()
        if not state.budget_allows(now):
            self.budget_exhausted[state.name] += 1
            return False
        state.retries.add(now)
        self.retries[state.name] += 1
        return True

    def settle(self, attempt: Attempt, failed: bool | None) -> None:
        """An attempt's outcome: True failure, False success, None neutral (see above)."""
        state = self._open.pop(attempt, None)
        if state is None:
            return
        state.outstanding -= 1
        trial = attempt in state.probes
        if trial:
            state.probes.discard(attempt)
        if failed is None:
            return
        if state.until is not None:
            if trial and failed:  # the probe (or a trial) decides
                self._eject(state, "its probe failed")
            elif trial:
                self._restore(state)
            return  # in flight before the ejection: says nothing new
        if not failed:
            state.consecutive = 0
            return
        state.consecutive += 1
        if state.eject_after and state.consecutive >= state.eject_after:
            self._eject(state, f"{state.consecutive} consecutive failures")

    def finished(self, ctx: RequestContext, _edges: object = None) -> None:
        """Telemetry sink: settle the attempt whose answer was relayed (and any left open)."""
        if not ctx.attempts:
            return
        for attempt in ctx.attempts:
            if attempt in self._open:
                self.settle(attempt, relayed_outcome(ctx, attempt))

    # ------------------------------------------------------------ transitions

    def _eject(self, state: BackendHealth, why: str) -> None:
        now = self._clock()
        if state.until is None:
            self._out += 1
        state.until = now + state.eject_for
        state.ejected_at = now
        state.consecutive = 0
        self.ejections[state.name] += 1
        log.warning("backend %s ejected for %g s: %s", state.name, state.eject_for, why)

    def _restore(self, state: BackendHealth) -> None:
        state.until = None
        state.ejected_at = None
        state.consecutive = 0
        self._out -= 1
        log.info("backend %s back in rotation: its probe succeeded", state.name)

    def _outstanding_of(self, backend: Backend) -> int:
        return self._states[backend].outstanding


def relayed_outcome(ctx: RequestContext, attempt: Attempt) -> bool | None:
    """The outcome of the attempt whose answer the gateway relayed (or began to)."""
    if ctx.disconnected or attempt.status is None:
        return None  # the client left, or the attempt was cancelled before its answer
    if attempt.status >= 500:
        return True
    return isinstance(ctx.answer.error, UpstreamError | UpstreamTimeout)


__all__ = ["Health", "Window", "relayed_outcome"]
