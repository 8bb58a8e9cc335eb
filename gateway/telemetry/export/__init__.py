"""Span export off the event loop: a bounded queue, one worker thread, OTLP sent by hand.

A request only ever appends its encoded spans to a bounded deque (O(1), no lock, no I/O);
when the queue is full the spans are dropped and counted, never waited for. The worker thread
frames batches into an ``ExportTraceServiceRequest`` (:mod:`gateway.telemetry.otlp`) and sends
those bytes itself -- no private API of an OpenTelemetry exporter (docs/spec.md §7):

- OTLP/HTTP: ``POST`` ``application/x-protobuf`` over a keep-alive ``http.client`` connection;
- OTLP/gRPC: the unary ``TraceService/Export`` call on a ``grpc`` channel with identity (bytes)
  serializers; ``grpcio`` is the optional extra ``llm-gateway[grpc]``.

Both honour the ``OTEL_EXPORTER_OTLP_(TRACES_)*`` variables (endpoint, headers, timeout,
compression, certificate, client key/certificate, protocol, insecure) wherever the config leaves
the key at its default, and retry retryable failures with exponential backoff and jitter (or the
collector's ``Retry-After`` / ``RetryInfo``) within the export timeout. A dead, black-holed or slow
collector therefore costs dropped spans, not request latency; shutdown waits a bounded time, and
the exporter's error log says so once, then at most once a minute.

Spec: https://opentelemetry.io/docs/specs/otlp/ (retries, status codes) and
https://opentelemetry.io/docs/specs/otel/protocol/exporter/ (the variables).

The package: :mod:`~gateway.telemetry.export.settings` (the config and ``OTEL_*``
resolved), :mod:`~gateway.telemetry.export.retrying` (the retry loop and the rate-limited error
log), the exporters (:mod:`~gateway.telemetry.export.http_exporter`,
:mod:`~gateway.telemetry.export.grpc_exporter`, :mod:`~gateway.telemetry.export.console`),
:mod:`~gateway.telemetry.export.rpc_status` (the collector's ``google.rpc`` error details) and
:mod:`~gateway.telemetry.export.span_queue` (the bounded queue and its worker thread).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gateway.config import TracingConfig
from gateway.telemetry.export.console import ConsoleExporter
from gateway.telemetry.export.grpc_exporter import GRPCExporter, grpc_target, import_grpc
from gateway.telemetry.export.http_exporter import RETRYABLE_HTTP, HTTPExporter
from gateway.telemetry.export.retrying import FailureLog, Outcome
from gateway.telemetry.export.settings import (
    DEFAULT_GRPC_ENDPOINT,
    DEFAULT_HTTP_ENDPOINT,
    GRPC_METHOD,
    METRICS_GRPC_METHOD,
    METRICS_PATH,
    TRACES_PATH,
    USER_AGENT,
    BatchExporter,
    EncodedBatch,
    ExportConfigError,
    OTLPSettings,
    display_url,
    parse_headers,
    resolve_settings,
)
from gateway.telemetry.export.span_queue import SpanQueue

__all__ = [
    "DEFAULT_GRPC_ENDPOINT",
    "DEFAULT_HTTP_ENDPOINT",
    "GRPC_METHOD",
    "METRICS_GRPC_METHOD",
    "METRICS_PATH",
    "RETRYABLE_HTTP",
    "TRACES_PATH",
    "USER_AGENT",
    "BatchExporter",
    "ConsoleExporter",
    "EncodedBatch",
    "ExportConfigError",
    "FailureLog",
    "GRPCExporter",
    "HTTPExporter",
    "OTLPSettings",
    "Outcome",
    "SpanQueue",
    "display_url",
    "grpc_target",
    "import_grpc",
    "make_exporter",
    "make_metrics_exporter",
    "parse_headers",
    "resolve_settings",
]


def make_exporter(cfg: TracingConfig, env: Mapping[str, str] | None = None) -> BatchExporter:
    """The exporter ``cfg`` asks for, with ``OTEL_EXPORTER_OTLP_*`` from ``env`` (os.environ).

    Raises :class:`ExportConfigError` when it cannot be built (e.g. grpc without grpcio).
    """
    if cfg.exporter == "console":
        return ConsoleExporter()
    if cfg.exporter != "otlp":
        raise ValueError(f"tracing.exporter = {cfg.exporter!r} has no exporter")
    settings = resolve_settings(cfg, os.environ if env is None else env)
    if settings.protocol == "grpc":
        return GRPCExporter(settings)
    return HTTPExporter(settings)


def make_metrics_exporter(cfg: TracingConfig, env: Mapping[str, str]) -> BatchExporter:
    """The OTLP exporter of the GenAI client metrics (``[tracing] metrics = true``): the spans'
    settings and retry, with the ``OTEL_EXPORTER_OTLP_METRICS_*`` variables and the metrics
    path (``/v1/metrics``) or method (``MetricsService/Export``)."""
    settings = resolve_settings(cfg, env, "metrics")
    if settings.protocol == "grpc":
        return GRPCExporter(settings, method=METRICS_GRPC_METHOD, what="metric")
    return HTTPExporter(settings, what="metric")
