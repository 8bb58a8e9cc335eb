"""The scrape's side: the snapshots of every worker merged into prometheus-client's metric
families (counters summed, gauges combined as each one says, histogram rows summed with the
newest exemplar per bucket)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.samples import Exemplar

from gateway.telemetry.metrics.series import ExemplarData, Histogram, Labels

#: gauge name -> (help, labels, how workers combine)
GAUGES: dict[str, tuple[str, Labels, Callable[[list[float]], float]]] = {
    "gateway_inflight_requests": ("Requests in flight", ("route",), sum),
    "gateway_backend_up": ("1 = the backend is in rotation, 0 = ejected", ("backend",), min),
    "gateway_ratelimit_fallback": (
        "1 while rate limits count per process because Redis is unreachable",
        (),
        max,
    ),
    "gateway_budget_used_ratio": (
        "Spent / budget of each tenant with a budget, this period (docs/spec.md §20)",
        ("tenant",),
        max,
    ),
    # the model servers' load as scraped (docs/spec.md §21): every worker scrapes the same
    # server, so workers agree up to a scrape period (the freshest age is the process's)
    "gateway_backend_queue_depth": (
        "Requests waiting in the model server's queue",
        ("backend",),
        max,
    ),
    "gateway_backend_running_requests": ("Requests the model server runs", ("backend",), max),
    "gateway_backend_kv_cache_usage_ratio": (
        "The model server's KV-cache usage (0..1)",
        ("backend",),
        max,
    ),
    "gateway_backend_saturated": (
        "1 = queue >= max_queue or KV-cache >= max_kv_cache: skipped while others are not",
        ("backend",),
        max,
    ),
    "gateway_backend_metrics_age_seconds": (
        "Seconds since the model server's metrics were last scraped",
        ("backend",),
        min,
    ),
    "gateway_realtime_sessions": ("Realtime sessions open", (), sum),
}


def merge_counters(snapshots: list[dict[str, Any]], name: str) -> dict[Labels, float]:
    out: dict[Labels, float] = {}
    for snap in snapshots:
        for labels, value in snap["counters"].get(name, ()):
            key = tuple(labels)
            out[key] = out.get(key, 0.0) + value
    return out


def merge_gauges(
    snapshots: list[dict[str, Any]], name: str, combine: Callable[[list[float]], float]
) -> dict[Labels, float]:
    values: dict[Labels, list[float]] = {}
    for snap in snapshots:
        for labels, value in snap["gauges"].get(name, ()):
            values.setdefault(tuple(labels), []).append(value)
    return {labels: combine(vs) for labels, vs in values.items()}


def histogram_family(h: Histogram, snapshots: list[dict[str, Any]]) -> HistogramMetricFamily:
    rows: dict[Labels, list[float]] = {}
    exemplars: dict[Labels, dict[int, ExemplarData]] = {}
    for snap in snapshots:
        for labels, row, exs in snap["histograms"].get(h.name, ()):
            key = tuple(labels)
            acc = rows.get(key)
            rows[key] = list(row) if acc is None else [a + b for a, b in zip(acc, row, strict=True)]
            best = exemplars.setdefault(key, {})
            for i, trace_id, value, ts in exs:
                if i not in best or best[i][2] < ts:
                    best[i] = (trace_id, value, ts)
    fam = HistogramMetricFamily(h.name, h.doc, labels=h.labelnames)
    bounds = [*(_le(b) for b in h.bounds), "+Inf"]
    for labels, row in rows.items():
        buckets: list[Any] = []
        cumulative = 0.0
        for i, le in enumerate(bounds):
            cumulative += row[i]
            ex = exemplars.get(labels, {}).get(i)
            if ex is None:
                buckets.append((le, cumulative))
            else:
                trace_id, value, ts = ex
                buckets.append(
                    (le, cumulative, Exemplar({"trace_id": f"{trace_id:032x}"}, value, ts))
                )
        fam.add_metric(labels, buckets, row[-1])
    return fam


def _le(bound: float) -> str:
    return repr(float(bound))


__all__ = ["GAUGES", "histogram_family", "merge_counters", "merge_gauges"]
