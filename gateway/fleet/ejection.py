"""Outlier ejection, per process (docs/spec.md §13): what an attempt's outcome is, whom it counts
against, and the transitions in and out of rotation — split out of :mod:`gateway.fleet.health`,
which keeps the retry budget, the in-flight counts and the route plans.

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
as another ejection). Any attempt that reaches a backend or pair out of rotation (a request that
chose it just before it was ejected, a pinned request, the one sent when every backend is out)
is such a trial; the outcomes of attempts that were already in flight when it was ejected are
ignored.

Pairs exist only for models that failed: a success for a model with no pair costs one dict
lookup, and nothing is stored. A backend tracks at most :data:`MAX_MODELS_PER_BACKEND` pairs
(model names come from clients, and a ``*`` route passes any): when full, the pair that failed
least recently and is in rotation makes room (an ejected one only when every pair is ejected).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from gateway.context import Attempt
from gateway.routes import Backend

log = logging.getLogger("gateway")

#: an attempt's outcome, as :meth:`Ejector.settle` takes it (``None``: neutral; see above)
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


class BackendRotation(Rotation):
    """One backend in rotation or out of it (connection-level), with its pairs."""

    __slots__ = ("eject_after", "eject_for", "models", "name", "pairs_out")

    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self.name = backend.name
        self.eject_after = backend.config.eject_after
        self.eject_for = backend.config.eject_for_s
        #: model -> its pair, only while it has failures or is out (oldest failure first)
        self.models: dict[str, PairHealth] = {}
        #: pairs out of rotation (0: no request for any model needs a pair lookup)
        self.pairs_out = 0

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


class Ejector:
    """The transitions of one process's backends and pairs, and what ``/metrics`` counts of
    them (keyed by backend name)."""

    def __init__(self, names: Iterable[str], clock: Callable[[], float]) -> None:
        self._clock = clock
        names = list(names)
        #: the backend's own ejections (connection failures)
        self.ejections: dict[str, int] = dict.fromkeys(names, 0)
        #: ejections of its (backend, model) pairs (answer failures)
        self.model_ejections: dict[str, int] = dict.fromkeys(names, 0)
        #: backends and pairs out of rotation (0: routing needs no availability check)
        self.out = 0

    def settle(
        self,
        state: BackendRotation,
        outcome: int,
        model: str | None,
        trial: bool,
        pair_trial: PairHealth | None,
    ) -> None:
        """An attempt's known outcome: ``trial`` when it was the backend's probe or a trial,
        ``pair_trial`` the pair it was a probe or trial of (None: none)."""
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

    def _count(self, state: BackendRotation, rot: Rotation, failed: bool, trial: bool) -> None:
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

    def _new_pair(self, state: BackendRotation, model: str) -> PairHealth:
        models = state.models
        if len(models) >= MAX_MODELS_PER_BACKEND:
            # the least recently failed in rotation; an ejected one only if all are
            victim = next((p for p in models.values() if p.until is None), None)
            if victim is None:
                victim = next(iter(models.values()))
                state.pairs_out -= 1
                self.out -= 1
            del models[victim.model]
        pair = models[model] = PairHealth(model)
        return pair

    def _eject(self, state: BackendRotation, rot: Rotation, why: str) -> None:
        now = self._clock()
        if rot.until is None:
            self.out += 1
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

    def _restore(self, state: BackendRotation, rot: Rotation) -> None:
        rot.until = None
        rot.ejected_at = None
        rot.consecutive = 0
        self.out -= 1
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


__all__ = [
    "ANSWER_FAILED",
    "CONNECTION_FAILED",
    "MAX_MODELS_PER_BACKEND",
    "SUCCESS",
    "BackendRotation",
    "Ejector",
    "PairHealth",
    "Rotation",
    "answer_outcome",
]
