"""The two series types of the gateway's metrics (docs/spec.md §11): plain dicts and lists the
hot path adds to — no locks, no label objects, no string formatting — and the bucket bounds."""

from __future__ import annotations

import bisect
import time

#: docs/spec.md §11: duration buckets cover 0.1 s … 10 s plus finer ones below (and LLM-long ones
#: above)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: the overhead and hop histograms start at 0.1 ms
FINE_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025)
FINE_BUCKETS = (*FINE_BUCKETS, 0.05, 0.1, 0.25, 0.5, 1)

Labels = tuple[str, ...]
#: (trace id, value, unix time) of the newest traced observation in a bucket
ExemplarData = tuple[int, float, float]
_bisect = bisect.bisect_left


class Counter:
    __slots__ = ("doc", "labelnames", "name", "untyped", "values")

    def __init__(self, name: str, doc: str, labelnames: Labels, untyped: bool = False) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = labelnames
        self.values: dict[Labels, float] = {}
        #: exposed as an untyped family under its full name (see :class:`RealtimeMetrics`)
        self.untyped = untyped

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount


class Histogram:
    __slots__ = ("bounds", "doc", "exemplars", "labelnames", "name", "series")

    def __init__(self, name: str, doc: str, labelnames: Labels, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = labelnames
        self.bounds = bounds
        #: labels -> [count per bucket (non-cumulative, last = +Inf)..., sum]
        self.series: dict[Labels, list[float]] = {}
        #: labels -> bucket index -> exemplar
        self.exemplars: dict[Labels, dict[int, ExemplarData]] = {}

    def observe(
        self, labels: Labels, value: float, trace_id: int | None = None, now: float = 0.0
    ) -> None:
        """Count ``value``; with ``trace_id``, keep it as its bucket's exemplar, stamped ``now``
        (``time.time()``; 0: read the clock here)."""
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        i = _bisect(self.bounds, value)  # le: a value equal to a bound counts in it
        row[i] += 1
        row[-1] += value
        if trace_id is not None:
            exemplars = self.exemplars.get(labels)
            if exemplars is None:
                exemplars = self.exemplars[labels] = {}
            exemplars[i] = (trace_id, value, now or time.time())

    def observe_each(self, pairs: tuple[tuple[Labels, float], ...]) -> None:
        """:meth:`observe` of several (labels, value) without exemplars, in one call."""
        series = self.series
        bounds = self.bounds
        for labels, value in pairs:
            row = series.get(labels)
            if row is None:
                row = series[labels] = [0.0] * (len(bounds) + 2)
            row[_bisect(bounds, value)] += 1
            row[-1] += value


__all__ = ["DURATION_BUCKETS", "FINE_BUCKETS", "Counter", "ExemplarData", "Histogram", "Labels"]
