"""Prometheus metrics (docs/spec.md §11), derived from the Timeline in one place at request end.

The hot path does plain dict and list arithmetic (:mod:`.series`: :class:`Histogram`,
:class:`Counter`): no locks, no label objects, no string formatting. :class:`Metrics`
(:mod:`.recorder`) records each finished request, with the series of the features beside the
model call in their groups (:mod:`.groups`). prometheus-client only renders, at scrape time,
through its public exposition API (:mod:`.exposition`, the workers' snapshots merged by
:mod:`.merge`): the text format, or OpenMetrics — with exemplars carrying the trace id — when the
scraper asks for it.
"""

from gateway.telemetry.metrics.exposition import (
    METRICS_DIR_ENV,
    SNAPSHOT_INTERVAL_S,
    Exposition,
    WorkerSnapshots,
)
from gateway.telemetry.metrics.groups import (
    A2aMetrics,
    McpMetrics,
    ObjectMetrics,
    RealtimeMetrics,
    SpendMetrics,
)
from gateway.telemetry.metrics.merge import GAUGES
from gateway.telemetry.metrics.recorder import MAX_MODELS, OTHER, Metrics
from gateway.telemetry.metrics.series import (
    DURATION_BUCKETS,
    FINE_BUCKETS,
    Counter,
    ExemplarData,
    Histogram,
    Labels,
)

__all__ = [
    "DURATION_BUCKETS",
    "FINE_BUCKETS",
    "GAUGES",
    "MAX_MODELS",
    "METRICS_DIR_ENV",
    "OTHER",
    "SNAPSHOT_INTERVAL_S",
    "A2aMetrics",
    "Counter",
    "ExemplarData",
    "Exposition",
    "Histogram",
    "Labels",
    "McpMetrics",
    "Metrics",
    "ObjectMetrics",
    "RealtimeMetrics",
    "SpendMetrics",
    "WorkerSnapshots",
]
