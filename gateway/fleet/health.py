"""Passive health and the retry budget, per process (docs/spec.md §13), and the route plans
that put ejection, saturation, affinity and the strategies together.

What an attempt's outcome is and whom it counts against, and the transitions in and out of
rotation (a backend, a (backend, model) pair, the probe), are :mod:`gateway.fleet.ejection`'s.
An ejected backend is skipped by every strategy for every model; an ejected pair only for its
model (the backend's other models stay in rotation there). When every backend of a route is
out for the request's model, the request still goes to the one whose cool-down ends first
rather than failing without trying — that attempt is a trial like the probe.

The retry budget: a retry — an attempt that sends the request again to the backend that just
failed it — is allowed while that backend's retries over the last 10 s stay under 20 % of its
requests (first attempts and fallbacks) over the same window, or while it has had fewer than 3
retries in the current second (the floor). Otherwise it is not sent, ``budget_exhausted`` is
counted, and the request goes on to the route's next backend if there is one (a fallback is a
new request for that backend, not a retry) or ends with the answer or error it has. A fallback
spreads load over the fleet; a retry is what hammers one failing backend. A retry is not sent to
a backend, or for a model to a pair, that the failure just ejected.

What the lead's ``/metrics`` reads (all keyed by backend name): :meth:`Health.up` (the backend,
connection-level: an ejected pair leaves it up), :attr:`Health.ejections`, :attr:`Health.retries`,
:attr:`Health.budget_exhausted`, :meth:`Health.outstanding` and :meth:`Health.load_gauges`;
``/readyz`` shows :meth:`Health.snapshot` (with the pairs out of rotation and the load).

Load (docs/spec.md §21): the scrapers of :mod:`gateway.fleet.load` publish each backend's
latest :class:`~gateway.fleet.load.Load` (:meth:`Health.publish`) into the scorer
(:class:`gateway.fleet.scorer.Scorer`), and :meth:`Health.order` reads its estimates — never a
scrape. On a route whose backends report load, or that has ``affinity``:

- a saturated backend (queue ≥ ``max_queue`` or KV-cache ≥ ``max_kv_cache``, as estimated now
  from a scrape not yet stale and what was sent since) is skipped while any unsaturated one
  is in rotation, under every strategy: the strategy orders the unsaturated ones, the
  saturated follow as the last fallbacks, the least loaded first. When every one is
  saturated the request goes to the least loaded — or, with ``shed_when_saturated``, is
  refused: 503 ``backend_saturated``, Retry-After 1;
- with an affinity key (:mod:`gateway.fleet.affinity`) the unsaturated backends are tried in the
  key's hash order instead of the strategy's: its preferred backend when that is in rotation
  and unsaturated, else the next in hash order (a spill).

Unknown load (no scrape yet, a failing one, a stale one) is never saturated.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gateway.config import RouteConfig
from gateway.context import Attempt, RequestContext
from gateway.errors import BackendSaturated, UpstreamError, UpstreamTimeout
from gateway.fleet.affinity import Rendezvous
from gateway.fleet.balance import LeastLoaded, Ordered, Strategy, make_strategy
from gateway.fleet.ejection import (
    ANSWER_FAILED,
    CONNECTION_FAILED,
    MAX_MODELS_PER_BACKEND,
    SUCCESS,
    BackendRotation,
    Ejector,
    PairHealth,
    answer_outcome,
)
from gateway.fleet.load import Load, has_load_source
from gateway.fleet.scorer import Scorer
from gateway.routes import Backend, Route

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


class BackendHealth(BackendRotation):
    """One backend's passive health in this process: its rotation (with its pairs), the
    attempts in flight and the retry budget's windows."""

    __slots__ = ("outstanding", "requests", "retries")

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self.outstanding = 0
        self.requests = Window()
        self.retries = Window()

    def budget_allows(self, now: float) -> bool:
        retries = self.retries.total(now)
        return (
            retries < BUDGET_RATIO * self.requests.total(now)
            or self.retries.this_second(now) < BUDGET_FLOOR_PER_S
        )


class RoutePlan:
    """How one route chooses among its backends (made once, per route)."""

    __slots__ = ("affinity", "fleet", "rendezvous", "shed", "strategy", "watched")

    def __init__(self, config: RouteConfig, backends: tuple[Backend, ...], strategy: Strategy):
        self.strategy = strategy
        #: "none" | "session" | "prefix"
        self.affinity = config.affinity
        self.shed = config.shed_when_saturated
        #: the backends in hash order for a key (None: no affinity)
        self.rendezvous = Rendezvous(backends) if config.affinity != "none" else None
        #: some backend's load is read (saturation applies)
        self.watched = any(has_load_source(b) for b in backends)
        #: load or affinity to heed (False: the strategy alone, as without a fleet)
        self.fleet = self.rendezvous is not None or self.watched


class HealthView:
    """The read side of :class:`Health`: what ``/readyz``, ``/metrics``, the live view and the
    strategies read of the passive health and the backends' load, and the scrapers' call that
    publishes a load. :class:`Health` keeps the state and changes it."""

    _clock: Callable[[], float]
    _states: dict[Backend, BackendHealth]
    _by_name: dict[str, BackendHealth]
    _plans: dict[int, RoutePlan]
    _ejector: Ejector
    _scorer: Scorer
    retries: dict[str, int]
    budget_exhausted: dict[str, int]

    # ------------------------------------------------------------ what others read

    @property
    def ejections(self) -> dict[str, int]:
        """The backends' own ejections (connection failures), by name."""
        return self._ejector.ejections

    @property
    def model_ejections(self) -> dict[str, int]:
        """Ejections of the backends' (backend, model) pairs (answer failures), by name."""
        return self._ejector.model_ejections

    def up(self, name: str) -> bool:
        """The backend in rotation (``gateway_backend_up`` 1) or out of it (0: ejected or
        probing). Connection-level: an ejected pair leaves it up."""
        return self._by_name[name].until is None

    def outstanding(self, name: str) -> int:
        """Attempts in flight on the backend (a stream counts until it ends)."""
        return self._by_name[name].outstanding

    def load(self, backend: Backend) -> Load | None:
        """The backend's load as last scraped, while it is fresh (None: unknown)."""
        return self._scorer.load(backend, self._clock())

    def load_gauges(self) -> dict[str, dict[tuple[str, ...], float]]:
        """The per-backend load gauges of ``/metrics`` (docs/spec.md §11, §21)."""
        return self._scorer.gauges(self._clock())

    def route(self, backends: tuple[Backend, ...]) -> RoutePlan | None:
        """The plan of the route whose backends tuple this is (None: not a route's)."""
        return self._plans.get(id(backends))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per backend: state, counters, seconds until the probe, and its models out of
        rotation with their state (for ``/readyz``)."""
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for backend, s in self._states.items():
            name = s.name
            row: dict[str, Any] = {
                "state": s.state(now),
                "up": s.until is None,
                "consecutive_failures": s.consecutive,
                "outstanding": s.outstanding,
                "ejections": self.ejections[name],
                "retries": self.retries[name],
                "budget_exhausted": self.budget_exhausted[name],
                "model_ejections": self.model_ejections[name],
                "models": {p.model: p.state(now) for p in s.models.values() if p.until is not None},
            }
            if s.until is not None:
                row["probe_in_s"] = round(max(0.0, s.until - now), 3)
            if has_load_source(backend):
                row["load"] = self._scorer.row(backend, now)
            out[name] = row
        return out

    # ------------------------------------------------------------ the scrapers' call

    def publish(self, backend: Backend, load: Load | None) -> None:
        """A scraper's latest snapshot of the backend's load (None: the scrape failed, the
        load is unknown)."""
        self._scorer.publish(backend, load)

    def _outstanding_of(self, backend: Backend) -> int:
        return self._states[backend].outstanding


class Health(HealthView):
    """Passive health, the retry budget and the route plans of one process."""

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
        self._ejector = Ejector(names, clock)
        self._scorer = Scorer(self._states, self._outstanding_of, clock)
        #: retries sent (to the backend that had just failed the request)
        self.retries: dict[str, int] = dict.fromkeys(names, 0)
        #: retries not sent because the backend's budget was spent
        self.budget_exhausted: dict[str, int] = dict.fromkeys(names, 0)
        #: attempts begun and not settled yet, with their backend's state
        self._open: dict[Attempt, BackendHealth] = {}
        #: attempts that are a pair's probe or trial (rare: empty keeps settle() lean)
        self._pair_trials: dict[Attempt, PairHealth] = {}
        self._ordered = Ordered()
        score = self._scorer.score
        #: the order when every backend is saturated, whatever the strategy
        self._least_loaded = LeastLoaded(score, rng)
        # a route's backends tuple is made once (runtime) and passed by the pipeline as is;
        # any other tuple (passthrough's one backend) is in configured order
        self._plans: dict[int, RoutePlan] = {
            id(r.backends): RoutePlan(
                r.config,
                r.backends,
                make_strategy(r.config, r.backends, self._outstanding_of, rng, score),
            )
            for r in routes
        }

    # ------------------------------------------------------------ the upstream hop's calls

    def order(
        self,
        backends: tuple[Backend, ...],
        model: str | None = None,
        ranked: Sequence[Backend] | None = None,
    ) -> Sequence[Backend]:
        """The backends to try for ``model``, in order: the route's strategy over those in
        rotation (the backend, and its pair for ``model``) — on a fleet-aware route the
        unsaturated ones first, in ``ranked`` order (an affinity key's hash order) when given.

        Raises :class:`BackendSaturated` when every one in rotation is saturated and the route
        sheds."""
        plan = self._plans.get(id(backends))
        strategy = plan.strategy if plan is not None else self._ordered
        fleet = plan is not None and plan.fleet
        out = self._ejector.out
        if not out and not fleet:
            return strategy.order(backends)
        now = self._clock()
        states = self._states
        available = backends
        if out:
            available = tuple(b for b in backends if states[b].available_for(model, now))
            if not available:
                # every one is out: the one whose cool-down ends first, rather than no attempt
                return (min(backends, key=lambda b: states[b].back_at(model)),)
        if not fleet:
            return strategy.order(available)
        assert plan is not None
        return self._fleet_order(plan, available, ranked, now, available is backends)

    def _fleet_order(
        self,
        plan: RoutePlan,
        available: tuple[Backend, ...],
        ranked: Sequence[Backend] | None,
        now: float,
        everyone: bool,
    ) -> Sequence[Backend]:
        """``available``: those in rotation (``everyone``: all the route's backends)."""
        busy: list[Backend] = []
        if plan.watched:
            saturated = self._scorer.saturated
            busy = [b for b in available if saturated(b, now)]
        free: Sequence[Backend] = available
        if busy:
            if len(busy) == len(available):
                if plan.shed:
                    raise BackendSaturated(
                        "every backend of this route is saturated; try again shortly"
                    )
                return self._least_loaded.order(available)
            free = tuple(b for b in available if b not in busy)
            busy = list(self._least_loaded.order(busy))
        if ranked is None:
            head = plan.strategy.order(free)
        elif everyone and not busy:
            return ranked  # the common case: every backend in rotation, none saturated
        else:
            head = [b for b in ranked if b in free]
        return [*head, *busy] if busy else head

    def begin(self, attempt: Attempt, retry: bool, model: str | None = None) -> None:
        state = self._states[attempt.backend]
        state.outstanding += 1
        self._open[attempt] = state
        if not retry:
            state.requests.add(self._clock())
        if state.until is not None:
            state.probes.add(attempt)  # the probe, or a trial: its outcome decides
        if state.pairs_out:
            pair = state.pair_out(model)
            if pair is not None:  # the pair's probe, or a trial
                pair.probes.add(attempt)
                self._pair_trials[attempt] = pair

    def may_retry(self, backend: Backend, model: str | None = None) -> bool:
        """Whether the request for ``model`` may be sent to ``backend`` again (reserves the
        retry)."""
        state = self._states[backend]
        if state.until is not None or state.pair_out(model) is not None:
            return False  # this failure ejected it (or the pair): the next backend, if any
        now = self._clock()
        if not state.budget_allows(now):
            self.budget_exhausted[state.name] += 1
            return False
        state.retries.add(now)
        self.retries[state.name] += 1
        return True

    def settle(self, attempt: Attempt, outcome: int | None, model: str | None = None) -> None:
        """An attempt's outcome (:data:`SUCCESS`, :data:`ANSWER_FAILED`,
        :data:`CONNECTION_FAILED`, or None: neutral) for a request for ``model``."""
        state = self._open.pop(attempt, None)
        if state is None:
            return
        state.outstanding -= 1
        trial = False
        if state.probes and attempt in state.probes:
            state.probes.discard(attempt)
            trial = True
        pair_trial = self._pair_trials.pop(attempt, None) if self._pair_trials else None
        if pair_trial is not None:
            pair_trial.probes.discard(attempt)
        if outcome is not None:
            self._ejector.settle(state, outcome, model, trial, pair_trial)

    def finished(self, ctx: RequestContext, _edges: object = None) -> None:
        """Telemetry sink: settle the attempt whose answer was relayed (and any left open)."""
        if not ctx.attempts:
            return
        for attempt in ctx.attempts:
            if attempt in self._open:
                self.settle(attempt, relayed_outcome(ctx, attempt), ctx.model)


def relayed_outcome(ctx: RequestContext, attempt: Attempt) -> int | None:
    """The outcome of the attempt whose answer the gateway relayed (or began to)."""
    if ctx.disconnected or attempt.status is None:
        return None  # the client left, or the attempt was cancelled before its answer
    outcome = answer_outcome(attempt.status, ctx.model)
    if outcome == SUCCESS and isinstance(ctx.answer.error, UpstreamError | UpstreamTimeout):
        return CONNECTION_FAILED  # it answered, then the connection broke (a stream cut)
    return outcome


__all__ = [
    "ANSWER_FAILED",
    "CONNECTION_FAILED",
    "MAX_MODELS_PER_BACKEND",
    "SUCCESS",
    "Health",
    "RoutePlan",
    "Window",
    "answer_outcome",
    "relayed_outcome",
]
