"""Passive health (outlier ejection) and the retry budget, per process (docs/spec.md §13).

What an attempt's outcome is (Envoy's ``consecutive_5xx`` with local-origin failures folded in),
and whom it counts against:

==================  =====================================================================
connection failure  the connection could not be made (refused, unreachable, DNS, connect
                    timeout); the upstream reset or closed it, broke HTTP framing or timed
                    out — before its answer or in the middle of its body (a stream cut,
                    truncated or idle). Counts against the **backend**.
answer failure      the upstream answered 500-599, or 429 to a request for a model. The
                    answer belongs to that model (one overloaded or rate-limited model says
                    nothing about the backend's others): it counts against the **(backend,
                    model) pair**, and for the backend as a connection that worked. A request
                    without a model (passthrough) has no pair: its 5xx counts against the
                    backend, its 429 is about the request.
success             any other answer (2xx, 3xx, every other 4xx: about the request, never
                    the upstream's health), counted when its body was relayed whole
neutral             the client went away, or the request was cancelled, before the outcome
                    was known
==================  =====================================================================

A backend and a pair follow the same rules (:class:`Rotation`). ``eject_after`` consecutive
failures (``0``: never) take it out of rotation for ``eject_for_s``. After the cool-down the
next request that would use it is the probe — the only one: until its outcome is known it takes
no other traffic. The probe's success puts it back; its failure starts a new cool-down (counted
as another ejection). An ejected backend is skipped by every strategy for every model; an
ejected pair only for its model (the backend's other models stay in rotation there). When every
backend of a route is out for the request's model, the request still goes to the one whose
cool-down ends first rather than failing without trying — that attempt is a trial like the
probe. Any attempt that reaches a backend or pair out of rotation (a request that chose it just
before it was ejected, a pinned request) is such a trial; the outcomes of attempts that were
already in flight when it was ejected are ignored.

Pairs exist only for models that failed: a success for a model with no pair costs one dict
lookup, and nothing is stored. A backend tracks at most :data:`MAX_MODELS_PER_BACKEND` pairs
(model names come from clients, and a ``*`` route passes any): when full, the pair that failed
least recently and is in rotation makes room (an ejected one only when every pair is ejected).

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

Load (docs/spec.md §21) lives here too, beside the ejections: the scrapers of
:mod:`gateway.hops.fleet` publish each backend's latest :class:`~gateway.hops.fleet.Load`
(:meth:`Health.publish`), and :meth:`Health.order` reads it — never a scrape. On a route whose
backends report load, or that has ``affinity``:

- a saturated backend (queue ≥ ``max_queue`` or KV-cache ≥ ``max_kv_cache``, as last scraped
  and not yet stale) is skipped while any unsaturated one is in rotation, under every strategy:
  the strategy orders the unsaturated ones, the saturated follow as the last fallbacks, the
  least loaded first. When every one is saturated the request goes to the least loaded — or,
  with ``shed_when_saturated``, is refused: 503 ``backend_saturated``, Retry-After 1;
- with an affinity key (:mod:`gateway.hops.affinity`) the unsaturated backends are tried in the
  key's hash order instead of the strategy's: its preferred backend when that is in rotation
  and unsaturated, else the next in hash order (a spill).

Unknown load (no scrape yet, a failing one, a stale one) is never saturated.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gateway.config import RouteConfig
from gateway.context import Attempt, RequestContext
from gateway.errors import BackendSaturated, UpstreamError, UpstreamTimeout
from gateway.hops.affinity import Rendezvous
from gateway.hops.balance import LeastLoaded, Ordered, Strategy, make_strategy
from gateway.hops.fleet import Load, has_load_source
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


#: an attempt's outcome, as :meth:`Health.settle` takes it (``None``: neutral; see above)
SUCCESS = 0
#: the upstream answered 5xx (or 429 for a model): against the (backend, model) pair
ANSWER_FAILED = 1
#: no answer, or the connection broke after it: against the backend
CONNECTION_FAILED = 2

#: (backend, model) pairs one backend tracks at most (model names come from clients)
MAX_MODELS_PER_BACKEND = 256


def answer_outcome(status: int, model: str | None) -> int:
    """What an upstream answer's status says about the upstream (its body not yet read).

    >>> answer_outcome(503, "m") == answer_outcome(429, "m") == ANSWER_FAILED
    True
    >>> answer_outcome(429, None) == answer_outcome(404, "m") == SUCCESS
    True
    """
    if status >= 500 or (status == 429 and model is not None):
        return ANSWER_FAILED
    return SUCCESS


class Rotation:
    """In rotation or out of it: a backend, or one model on a backend (a pair)."""

    __slots__ = ("consecutive", "ejected_at", "probes", "until")

    def __init__(self) -> None:
        self.consecutive = 0
        #: out of rotation until this monotonic time (None: in rotation)
        self.until: float | None = None
        self.ejected_at: float | None = None
        #: attempts that reached it while out of rotation (the probe, trials)
        self.probes: set[Attempt] = set()

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


class PairHealth(Rotation):
    """One model's health on one backend: its answers' failures (5xx, 429)."""

    __slots__ = ("model",)

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model


class BackendHealth(Rotation):
    """One backend's passive health in this process (connection-level), with its pairs."""

    __slots__ = (
        "eject_after",
        "eject_for",
        "load",
        "load_base",
        "models",
        "name",
        "outstanding",
        "pairs_out",
        "requests",
        "retries",
        "scraped_at",
        "watched",
    )

    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self.name = backend.name
        self.eject_after = backend.config.eject_after
        self.eject_for = backend.config.eject_for_s
        #: model -> its pair, only while it has failures or is out (oldest failure first)
        self.models: dict[str, PairHealth] = {}
        #: pairs out of rotation (0: no request for any model needs a pair lookup)
        self.pairs_out = 0
        self.outstanding = 0
        self.requests = Window()
        self.retries = Window()
        #: whether its model server's load is read (docs/spec.md §21)
        self.watched = has_load_source(backend)
        #: the last scrape's load (None: unknown), and ``outstanding`` when it was published
        self.load: Load | None = None
        self.load_base = 0
        #: when a scrape last worked (monotonic; None: never)
        self.scraped_at: float | None = None

    def known_load(self, now: float) -> Load | None:
        """The last scrape's load while it is fresh (None: unknown)."""
        load = self.load
        return load if load is not None and now < load.until else None

    def saturated(self, now: float) -> bool:
        load = self.load
        return load is not None and load.saturated and now < load.until

    def available_for(self, model: str | None, now: float) -> bool:
        """Whether a request for ``model`` may use this backend (it and the pair available)."""
        if not self.available(now):
            return False
        if not self.pairs_out or model is None:
            return True
        pair = self.models.get(model)
        return pair is None or pair.available(now)

    def back_at(self, model: str | None) -> float:
        """When its cool-down (or the pair's, whichever is later) for ``model`` ends."""
        until = self.until or 0.0
        if self.pairs_out and model is not None:
            pair = self.models.get(model)
            if pair is not None and pair.until is not None:
                until = max(until, pair.until)
        return until

    def pair_out(self, model: str | None) -> PairHealth | None:
        """The pair for ``model`` when it is out of rotation."""
        if not self.pairs_out or model is None:
            return None
        pair = self.models.get(model)
        return pair if pair is not None and pair.until is not None else None

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
    ejections: dict[str, int]
    model_ejections: dict[str, int]
    retries: dict[str, int]
    budget_exhausted: dict[str, int]

    # ------------------------------------------------------------ what others read

    def up(self, name: str) -> bool:
        """The backend in rotation (``gateway_backend_up`` 1) or out of it (0: ejected or
        probing). Connection-level: an ejected pair leaves its backend up."""
        return self._by_name[name].until is None

    def outstanding(self, name: str) -> int:
        """Attempts in flight on the backend (a stream counts until it ends)."""
        return self._by_name[name].outstanding

    def load(self, backend: Backend) -> Load | None:
        """The backend's load as last scraped, while it is fresh (None: unknown)."""
        return self._states[backend].known_load(self._clock())

    def load_gauges(self) -> dict[str, dict[tuple[str, ...], float]]:
        """The per-backend load gauges of ``/metrics`` (docs/spec.md §11, §21), for the
        backends whose load is read; queue, running and KV-cache only while known."""
        now = self._clock()
        queue: dict[tuple[str, ...], float] = {}
        running: dict[tuple[str, ...], float] = {}
        kv_cache: dict[tuple[str, ...], float] = {}
        saturated: dict[tuple[str, ...], float] = {}
        age: dict[tuple[str, ...], float] = {}
        for name, s in self._by_name.items():
            if not s.watched:
                continue
            key = (name,)
            saturated[key] = float(s.saturated(now))
            if s.scraped_at is not None:
                age[key] = round(max(0.0, now - s.scraped_at), 3)
            load = s.known_load(now)
            if load is None:
                continue
            queue[key] = load.queue
            if load.running is not None:
                running[key] = load.running
            if load.kv_cache is not None:
                kv_cache[key] = load.kv_cache
        return {
            "gateway_backend_queue_depth": queue,
            "gateway_backend_running_requests": running,
            "gateway_backend_kv_cache_usage_ratio": kv_cache,
            "gateway_backend_saturated": saturated,
            "gateway_backend_metrics_age_seconds": age,
        }

    def route(self, backends: tuple[Backend, ...]) -> RoutePlan | None:
        """The plan of the route whose backends tuple this is (None: not a route's)."""
        return self._plans.get(id(backends))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per backend: state, counters, seconds until the probe, and its models out of
        rotation with their state (for ``/readyz``)."""
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
                "model_ejections": self.model_ejections[name],
                "models": {p.model: p.state(now) for p in s.models.values() if p.until is not None},
            }
            if s.until is not None:
                row["probe_in_s"] = round(max(0.0, s.until - now), 3)
            if s.watched:
                row["load"] = _load_row(s, now)
            out[name] = row
        return out

    # ------------------------------------------------------------ the scrapers' call

    def publish(self, backend: Backend, load: Load | None) -> None:
        """A scraper's latest snapshot of the backend's load (None: the scrape failed, the
        load is unknown)."""
        state = self._states[backend]
        state.load = load
        state.load_base = state.outstanding
        if load is not None:
            state.scraped_at = load.at

    def _outstanding_of(self, backend: Backend) -> int:
        return self._states[backend].outstanding

    def _score(self, backend: Backend) -> tuple[float, float, int]:
        """``least_loaded``'s view of a backend (see :mod:`gateway.hops.balance`): its queue
        depth and KV-cache usage as scraped, moved by what this gateway sent it since (and what
        finished since), and this gateway's in-flight requests; unknown load is scored by the
        in-flight requests alone."""
        state = self._states[backend]
        out = state.outstanding
        load = state.known_load(self._clock())
        if load is None:
            return float(out), 1.0, out
        return (*estimate(load, out - state.load_base), out)


class Health(HealthView):
    """Passive health, the retry budget, backend load and the route strategies of one
    process."""

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
        #: the backend's own ejections (connection failures)
        self.ejections: dict[str, int] = dict.fromkeys(names, 0)
        #: ejections of its (backend, model) pairs (answer failures)
        self.model_ejections: dict[str, int] = dict.fromkeys(names, 0)
        #: retries sent (to the backend that had just failed the request)
        self.retries: dict[str, int] = dict.fromkeys(names, 0)
        #: retries not sent because the backend's budget was spent
        self.budget_exhausted: dict[str, int] = dict.fromkeys(names, 0)
        #: attempts begun and not settled yet, with their backend's state
        self._open: dict[Attempt, BackendHealth] = {}
        #: attempts that are a pair's probe or trial (rare: empty keeps settle() lean)
        self._pair_trials: dict[Attempt, PairHealth] = {}
        self._out = 0  # backends and pairs out of rotation: 0 keeps order() a lookup
        self._ordered = Ordered()
        #: the order when every backend is saturated, whatever the strategy
        self._least_loaded = LeastLoaded(self._score, rng)
        # a route's backends tuple is made once (runtime) and passed by the pipeline as is;
        # any other tuple (passthrough's one backend) is in configured order
        self._plans: dict[int, RoutePlan] = {
            id(r.backends): RoutePlan(
                r.config,
                r.backends,
                make_strategy(r.config, r.backends, self._outstanding_of, rng, self._score),
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
        if not self._out and not fleet:
            return strategy.order(backends)
        now = self._clock()
        states = self._states
        available = backends
        if self._out:
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
            states = self._states
            busy = [b for b in available if states[b].saturated(now)]
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
        if outcome is None:
            return
        if outcome == CONNECTION_FAILED or model is None:
            self._count(state, state, outcome != SUCCESS, trial)
            return
        # it answered: the connection worked, whatever the answer says about the model
        if trial or state.until is not None:
            self._count(state, state, False, trial)
        else:
            state.consecutive = 0
        models = state.models
        if not models and outcome == SUCCESS:
            return  # the common case: no model of this backend has failed
        pair = models.get(model)
        if outcome == SUCCESS:
            if pair is not None:
                self._count(state, pair, False, pair is pair_trial)
            return
        if pair is None:
            pair = self._new_pair(state, model)
        else:  # the most recently failed last: eviction takes the front
            del models[model]
            models[model] = pair
        self._count(state, pair, True, pair is pair_trial)

    def finished(self, ctx: RequestContext, _edges: object = None) -> None:
        """Telemetry sink: settle the attempt whose answer was relayed (and any left open)."""
        if not ctx.attempts:
            return
        for attempt in ctx.attempts:
            if attempt in self._open:
                self.settle(attempt, relayed_outcome(ctx, attempt), ctx.model)

    # ------------------------------------------------------------ transitions

    def _count(self, state: BackendHealth, rot: Rotation, failed: bool, trial: bool) -> None:
        """One outcome for ``rot`` (the backend ``state`` itself, or one of its pairs)."""
        if rot.until is not None:
            if trial and failed:  # the probe (or a trial) decides
                self._eject(state, rot, "its probe failed")
            elif trial:
                self._restore(state, rot)
            return  # in flight before the ejection: says nothing new
        if not failed:
            rot.consecutive = 0
            if isinstance(rot, PairHealth) and state.models.get(rot.model) is rot:
                del state.models[rot.model]  # a pair with no failures is no pair
            return
        rot.consecutive += 1
        if state.eject_after and rot.consecutive >= state.eject_after:
            self._eject(state, rot, f"{rot.consecutive} consecutive failures")

    def _new_pair(self, state: BackendHealth, model: str) -> PairHealth:
        models = state.models
        if len(models) >= MAX_MODELS_PER_BACKEND:
            # the least recently failed in rotation; an ejected one only if all are
            victim = next((p for p in models.values() if p.until is None), None)
            if victim is None:
                victim = next(iter(models.values()))
                state.pairs_out -= 1
                self._out -= 1
            del models[victim.model]
        pair = models[model] = PairHealth(model)
        return pair

    def _eject(self, state: BackendHealth, rot: Rotation, why: str) -> None:
        now = self._clock()
        if rot.until is None:
            self._out += 1
            if rot is not state:
                state.pairs_out += 1
        rot.until = now + state.eject_for
        rot.ejected_at = now
        rot.consecutive = 0
        if isinstance(rot, PairHealth):
            self.model_ejections[state.name] += 1
            log.warning(
                "backend %s ejected for model %s for %g s: %s",
                state.name,
                rot.model,
                state.eject_for,
                why,
            )
        else:
            self.ejections[state.name] += 1
            log.warning("backend %s ejected for %g s: %s", state.name, state.eject_for, why)

    def _restore(self, state: BackendHealth, rot: Rotation) -> None:
        rot.until = None
        rot.ejected_at = None
        rot.consecutive = 0
        self._out -= 1
        if isinstance(rot, PairHealth):
            state.pairs_out -= 1
            if state.models.get(rot.model) is rot:
                del state.models[rot.model]  # back in rotation, no failures: no pair
            log.info(
                "backend %s back in rotation for model %s: its probe succeeded",
                state.name,
                rot.model,
            )
        else:
            log.info("backend %s back in rotation: its probe succeeded", state.name)


def estimate(load: Load, sent: int) -> tuple[float, float]:
    """A backend's (queue depth, KV-cache usage) now, from its last scrape and the requests
    this gateway ``sent`` it since (net of those that finished; negative when more finished).

    A server that was queueing queues them; one that was not runs them, each taking the KV-cache
    share its running requests took on average (unknown while it ran none: it keeps its usage,
    and in-flight requests break the tie). So between two scrapes a burst fills the backends in
    proportion to their room instead of herding onto the one that looked emptiest.

    >>> a = Load(0, 2, 0.5, False, 0, 1)   # 2 running in half its KV cache
    >>> estimate(a, 1), estimate(a, -1)
    ((0.0, 0.75), (0.0, 0.25))
    >>> estimate(Load(3.0, 8.0, 0.9, False, 0, 1), 2)
    (5.0, 0.9)
    """
    queue, running, kv = load.queue, load.running, load.kv_cache
    if queue > 0 or kv is None:  # queueing (or no KV-cache figure): what is sent waits
        return max(0.0, queue + sent), kv or 0.0
    if not running:  # idle: its share per request is unknown
        return 0.0, kv
    return 0.0, max(0.0, kv * (running + sent) / running)


def _load_row(state: BackendHealth, now: float) -> dict[str, Any]:
    """A backend's load as ``/readyz`` and the live view show it."""
    load = state.known_load(now)
    age = None if state.scraped_at is None else round(max(0.0, now - state.scraped_at), 3)
    if load is None:
        return {"known": False, "age_s": age}
    return {
        "known": True,
        "queue": load.queue,
        "running": load.running,
        "kv_cache": load.kv_cache,
        "saturated": load.saturated,
        "age_s": age,
    }


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
