"""The GenAI client metrics, exported over OTLP (``[tracing] metrics = true``, docs/spec.md §7).

The gateway is the GenAI client of its upstreams, so it records what the OpenTelemetry GenAI
conventions ask of one, per model call that reached a provider (a cache hit did not):

- ``gen_ai.client.operation.duration`` (s): the first attempt's start to the last one's end
  (retries and their waits included: the client operation as a caller of the provider sees it),
  with ``error.type`` when it failed;
- ``gen_ai.client.token.usage`` ({token}): the input and the output tokens the provider reported
  (``gen_ai.token.type`` = ``input`` | ``output``);
- ``gen_ai.client.operation.time_to_first_chunk`` (s): streams only, the answering attempt's
  start to the first content event.

Each with ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``server.address`` and ``server.port``, and the bucket boundaries the
conventions give. A request adds to in-memory histograms on the event loop (a dict lookup, a
``bisect``, one new row swapped in whole, so the exporting thread never reads half an update);
every ``metrics_interval_s`` a thread encodes the cumulative histograms with the official
``opentelemetry-proto`` classes and sends them with the spans' exporter settings and retry
(:func:`gateway.telemetry.export.make_metrics_exporter`). The resource is the spans' plus a
``service.instance.id`` of the process, so the workers' cumulative series stay apart. Nothing
of this exists, and nothing is paid per request, unless ``metrics = true``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from gateway import __version__
from gateway.context import RequestContext
from gateway.telemetry.export import BatchExporter, EncodedBatch

log = logging.getLogger("gateway.tracing")

#: the conventions' ExplicitBucketBoundaries
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, … 67108864
DURATION_BUCKETS = tuple(0.01 * 2**i for i in range(14))  # 0.01, 0.02, … 81.92
#: distinct attribute sets kept per instrument before the models are counted as "_OTHER"
MAX_SERIES = 2000

Key = tuple[tuple[str, Any], ...]


class CumulativeHistogram:
    """One cumulative histogram instrument: attribute set -> [bucket counts…, count, sum,
    min, max]."""

    __slots__ = ("bounds", "description", "name", "rows", "unit")

    def __init__(self, name: str, unit: str, description: str, bounds: tuple[float, ...]) -> None:
        self.name, self.unit, self.description, self.bounds = name, unit, description, bounds
        self.rows: dict[Key, list[float]] = {}

    def record(self, key: Key, value: float) -> None:
        n = len(self.bounds)
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= MAX_SERIES:
                key = tuple((k, "_OTHER" if k.endswith(".model") else v) for k, v in key)
                row = self.rows.get(key)
            if row is None:
                row = [0.0] * (n + 3) + [math.inf, -math.inf]
        new = row.copy()
        new[bisect_left(self.bounds, value)] += 1  # bucket i: (bounds[i-1], bounds[i]]
        new[n + 1] += 1
        new[n + 2] += value
        new[n + 3] = min(new[n + 3], value)
        new[n + 4] = max(new[n + 4], value)
        self.rows[key] = new  # one store: a reader sees the old row or the new one


class GenAIMetrics:
    """The three instruments, the sink that records into them and the export thread."""

    def __init__(
        self,
        exporter: BatchExporter,
        resource: Mapping[str, Any],
        interval_s: float,
    ) -> None:
        self.exporter = exporter
        self.duration = CumulativeHistogram(
            "gen_ai.client.operation.duration", "s", "GenAI operation duration.", DURATION_BUCKETS
        )
        self.tokens = CumulativeHistogram(
            "gen_ai.client.token.usage",
            "{token}",
            "Number of input and output tokens used.",
            TOKEN_BUCKETS,
        )
        self.first_chunk = CumulativeHistogram(
            "gen_ai.client.operation.time_to_first_chunk",
            "s",
            "Time to receive the first chunk in a streaming response.",
            DURATION_BUCKETS,
        )
        self._resource = {**resource, "service.instance.id": uuid.uuid4().hex}
        self._start_ns = time.time_ns()
        self._interval = interval_s
        self._stop = threading.Event()
        self.exported = 0
        self._thread = threading.Thread(target=self._run, name="gateway-genai-metrics", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ per request (event loop)

    def __call__(self, ctx: RequestContext, edges: Any) -> None:
        """The Telemetry sink: a model call that reached a provider is recorded."""
        attempts = ctx.attempts
        call = ctx.call
        if not attempts or call is None or ctx.mcp is not None:
            return
        last = attempts[-1]
        b = last.backend
        answer = ctx.answer
        base: Key = (
            ("gen_ai.operation.name", call.operation),
            ("gen_ai.provider.name", b.provider),
            ("gen_ai.request.model", ctx.model or ""),
            ("gen_ai.response.model", answer.response_model or ""),
            ("server.address", b.host),
            ("server.port", b.port),
        )
        done = ctx.timeline.done
        end = last.end if last.end is not None else (done if done is not None else last.start)
        error = answer.error_type()
        key = (*base, ("error.type", error)) if error is not None else base
        self.duration.record(key, max(0.0, end - attempts[0].start))
        usage = answer.tokens
        if usage.input is not None:
            self.tokens.record((*base, ("gen_ai.token.type", "input")), usage.input)
        if usage.output is not None:
            self.tokens.record((*base, ("gen_ai.token.type", "output")), usage.output)
        first = ctx.timeline.first_content
        if call.stream and first is not None:
            self.first_chunk.record(base, max(0.0, first - last.start))

    # ------------------------------------------------------------ export (its own thread)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.export()

    def export(self) -> bool:
        """Send the cumulative histograms now (False: nothing to send, or it failed)."""
        try:
            data, points = encode(self._resource, self._start_ns, self.instruments())
        except Exception:  # a bug must never kill the thread
            log.exception("GenAI metrics could not be encoded")
            return False
        if not points:
            return False
        ok = self.exporter.export(EncodedBatch(data, points))
        self.exported += points if ok else 0
        return ok

    def instruments(self) -> list[tuple[CumulativeHistogram, list[tuple[Key, list[float]]]]]:
        """Each instrument with a copy of its rows (``list(dict.items())`` is one step)."""
        return [(h, list(h.rows.items())) for h in (self.duration, self.tokens, self.first_chunk)]

    def shutdown(self, timeout_s: float) -> None:
        """One last export (within ``timeout_s``), then the exporter is closed."""
        self._stop.set()
        self._thread.join(timeout_s)
        try:
            if not self._thread.is_alive():  # else it is still exporting: never two at once
                self.export()
        finally:
            self.exporter.shutdown()


def encode(
    resource: Mapping[str, Any],
    start_ns: int,
    instruments: list[tuple[CumulativeHistogram, list[tuple[Key, list[float]]]]],
) -> tuple[bytes, int]:
    """An ``ExportMetricsServiceRequest`` (opentelemetry/proto/collector/metrics/v1) of
    cumulative histograms, and how many data points it holds."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.metrics.v1 import metrics_pb2
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    now = time.time_ns()
    metrics = []
    points = 0
    for histogram, rows in instruments:
        if rows:
            metrics.append(_metric(metrics_pb2, histogram, rows, start_ns, now))
            points += len(rows)
    request = ExportMetricsServiceRequest(
        resource_metrics=[
            metrics_pb2.ResourceMetrics(
                resource=Resource(attributes=[_kv(k, v) for k, v in resource.items()]),
                scope_metrics=[
                    metrics_pb2.ScopeMetrics(
                        scope=InstrumentationScope(name="llm-gateway", version=__version__),
                        metrics=metrics,
                    )
                ],
            )
        ]
    )
    return request.SerializeToString(), points


def _metric(
    metrics_pb2: Any,
    histogram: CumulativeHistogram,
    rows: list[tuple[Key, list[float]]],
    start_ns: int,
    now: int,
) -> Any:
    """One cumulative histogram ``Metric`` with a data point per attribute set."""
    n = len(histogram.bounds)
    data_points = [
        metrics_pb2.HistogramDataPoint(
            attributes=[_kv(k, v) for k, v in key],
            start_time_unix_nano=start_ns,
            time_unix_nano=now,
            count=int(row[n + 1]),
            sum=row[n + 2],
            bucket_counts=[int(c) for c in row[: n + 1]],
            explicit_bounds=histogram.bounds,
            min=row[n + 3],
            max=row[n + 4],
        )
        for key, row in rows
    ]
    return metrics_pb2.Metric(
        name=histogram.name,
        unit=histogram.unit,
        description=histogram.description,
        histogram=metrics_pb2.Histogram(
            data_points=data_points,
            aggregation_temporality=metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE,
        ),
    )


def _kv(key: str, value: Any) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


__all__ = ["DURATION_BUCKETS", "TOKEN_BUCKETS", "CumulativeHistogram", "GenAIMetrics", "encode"]
