"""Load balancing on a route (docs/spec.md §4, §13): which backend a request tries first.

A strategy orders the route's backends that are in rotation for the request's model (passive
health has already removed the ejected backends, and those whose pair for that model is
ejected, :mod:`gateway.fleet.health`): the first is the backend the first
attempt goes to, the others are the fallback order. Every strategy is per process and keeps
only what it needs between requests (the weighted cursor); nothing per request (habit 2).

- ``ordered``: the configured order (the first backend takes everything; the others are
  fallbacks).
- ``weighted``: nginx's smooth weighted round robin. Weights 3:1 give ``a a b a`` in every
  four picks — exact over each cycle, never a burst of one backend; the fallback after the pick
  is the configured order. A backend out of rotation is simply not a candidate, and the others
  share its part in proportion to their weights.
- ``least_outstanding``: the backend with the fewest attempts in flight in this process (ties
  broken at random), then the others by the same count — Envoy's least-request balancer. With
  the handful of backends a route lists, all of them are compared (the power of two choices
  is for large fleets, where comparing all would cost).
- ``least_loaded`` (docs/spec.md §21): the backend where a request sent now waits least, then
  the one it fills least, then the lowest KV-cache usage, then this gateway's fewest in-flight
  requests, ties at random (the score: :class:`gateway.fleet.scorer.Scorer`). Among three or
  more that tie on the wait (several with room), the first is the better of two drawn at random
  — the power of two choices.

Saturation and affinity sit above the strategies (:meth:`gateway.fleet.health.Health.order`): a
strategy orders the candidates it is given.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.config import RouteConfig
from gateway.routes import Backend

#: how many attempts are in flight on a backend (kept by :class:`gateway.fleet.health.Health`)
Outstanding = Callable[[Backend], int]
#: a backend's load as ``least_loaded`` ranks it (lowest first): the wait a request sent now
#: would have, how full it would be, its KV-cache usage, this gateway's in-flight requests there
Score = Callable[[Backend], tuple[float, float, float, int]]


class Strategy(Protocol):
    def order(self, candidates: Sequence[Backend]) -> Sequence[Backend]:
        """``candidates`` (in rotation, configured order, at least one) in the order to try."""
        ...


class Ordered:
    """Configured order: the first backend first, the others as fallbacks."""

    def order(self, candidates: Sequence[Backend]) -> Sequence[Backend]:
        return candidates


class Weighted:
    """Smooth weighted round robin (nginx ``ngx_http_upstream_get_peer``)."""

    __slots__ = ("_current", "_weights")

    def __init__(self, backends: Sequence[Backend], weights: Sequence[float]) -> None:
        self._weights = dict(zip(backends, weights, strict=True))
        self._current = dict.fromkeys(backends, 0.0)

    def order(self, candidates: Sequence[Backend]) -> Sequence[Backend]:
        if len(candidates) == 1:
            return candidates
        current = self._current
        total = 0.0
        best: Backend | None = None
        for b in candidates:
            weight = self._weights.get(b, 1.0)
            current[b] = current.get(b, 0.0) + weight
            total += weight
            if best is None or current[b] > current[best]:
                best = b
        assert best is not None
        current[best] -= total
        return (best, *(b for b in candidates if b is not best))


class LeastOutstanding:
    """Fewest attempts in flight first; ties at random."""

    __slots__ = ("_outstanding", "_random")

    def __init__(self, outstanding: Outstanding, rng: random.Random | None = None) -> None:
        self._outstanding = outstanding
        self._random = (rng or random.Random()).random

    def order(self, candidates: Sequence[Backend]) -> Sequence[Backend]:
        if len(candidates) == 1:
            return candidates
        outstanding, tie = self._outstanding, self._random
        return sorted(candidates, key=lambda b: (outstanding(b), tie()))


class LeastLoaded:
    """Lowest score first (:class:`gateway.fleet.scorer.Scorer`); ties at random. Among three
    or more backends that tie on the expected wait (several with room), the first is the better
    of two of them drawn at random — the power of two choices — so that replicas reading the
    same scrapes do not all pick the one that looks emptiest."""

    __slots__ = ("_random", "_rng", "_score")

    def __init__(self, score: Score, rng: random.Random | None = None) -> None:
        self._score = score
        self._rng = rng or random.Random()
        self._random = self._rng.random

    def order(self, candidates: Sequence[Backend]) -> Sequence[Backend]:
        if len(candidates) == 1:
            return candidates
        score, tie = self._score, self._random
        keys = {b: (*score(b), tie()) for b in candidates}
        ranked = sorted(candidates, key=keys.__getitem__)
        if len(ranked) > 2:
            best = keys[ranked[0]][0]
            equals = [b for b in ranked if keys[b][0] == best]
            if len(equals) > 2:
                x, y = self._rng.sample(equals, 2)
                first = x if keys[x] < keys[y] else y
                return (first, *(b for b in ranked if b is not first))
        return ranked


def make_strategy(
    config: RouteConfig,
    backends: Sequence[Backend],
    outstanding: Outstanding,
    rng: random.Random | None = None,
    score: Score | None = None,
) -> Strategy:
    """The route's strategy (``strategy`` and ``weights`` were validated with the config)."""
    if config.strategy == "weighted" and config.weights is not None:
        return Weighted(backends, config.weights)
    if config.strategy == "least_outstanding":
        return LeastOutstanding(outstanding, rng)
    if config.strategy == "least_loaded" and score is not None:
        return LeastLoaded(score, rng)
    return Ordered()


__all__ = [
    "LeastLoaded",
    "LeastOutstanding",
    "Ordered",
    "Outstanding",
    "Score",
    "Strategy",
    "Weighted",
    "make_strategy",
]
