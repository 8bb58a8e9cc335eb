"""Span export off the event loop: a bounded queue, one worker thread, the official exporters.

A request only ever appends its encoded spans to a bounded deque (O(1), no lock, no I/O);
when the queue is full the spans are dropped and counted, never waited for. The worker thread
frames batches into an ``ExportTraceServiceRequest`` and hands them to the official OTLP
exporter (HTTP/protobuf or gRPC, which keeps their ``OTEL_EXPORTER_OTLP_*`` env handling,
TLS, headers, compression, retries with backoff). A dead, black-holed or slow collector
therefore costs dropped spans, not request latency. Shutdown waits a bounded time.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

from gateway.telemetry.otlp import RequestEncoder

log = logging.getLogger("gateway.tracing")


class EncodedBatch:
    """A framed ExportTraceServiceRequest and how many spans it holds."""

    __slots__ = ("count", "data")

    def __init__(self, data: bytes, count: int) -> None:
        self.data = data
        self.count = count


class BatchExporter(Protocol):
    def export(self, batch: EncodedBatch) -> bool: ...

    def shutdown(self) -> None: ...


class OTLPHttpExporter:
    """The official OTLP/HTTP exporter, fed bytes this package encoded."""

    def __init__(self, endpoint: str | None, timeout: float | None) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if endpoint is not None:
            # like Jaeger's docs, the config names the collector's base URL (…:4318)
            parts = urlsplit(endpoint)
            if parts.path in ("", "/"):
                endpoint = endpoint.rstrip("/") + "/v1/traces"
        self._exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
        # The SDK encodes inside export(); we already hold the encoded bytes, so we use the
        # client it built from config + OTEL_* env (private: checked here, covered by tests).
        client = getattr(self._exporter, "_client", None)
        if client is None or not hasattr(client, "export"):
            raise RuntimeError("unsupported opentelemetry-exporter-otlp-proto-http version")
        self._client = client
        self.endpoint: str = self._exporter._endpoint

    def export(self, batch: EncodedBatch) -> bool:
        return bool(self._client.export(batch.data).success)

    def shutdown(self) -> None:
        self._exporter.shutdown()  # type: ignore[no-untyped-call]


def _grpc_exporter_class() -> type[Any]:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class _EncodedGrpcExporter(OTLPSpanExporter):
        # OTLPExporterMixin's extension points: how to build the request and count it
        def _translate_data(self, data: Any) -> ExportTraceServiceRequest:
            request: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(data.data)
            return request

        def _count_data(self, data: Any) -> int:
            return int(data.count)

    return _EncodedGrpcExporter


class OTLPGrpcExporter:
    def __init__(self, endpoint: str | None, timeout: float | None) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout}
        if endpoint is not None:
            parts = urlsplit(endpoint)
            kwargs["endpoint"] = parts.netloc or endpoint
            kwargs["insecure"] = parts.scheme != "https"
        self._exporter = _grpc_exporter_class()(**kwargs)
        self.endpoint: str = str(kwargs.get("endpoint", "<OTEL_EXPORTER_OTLP_ENDPOINT>"))

    def export(self, batch: EncodedBatch) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return bool(self._exporter._export(batch) == SpanExportResult.SUCCESS)

    def shutdown(self) -> None:
        self._exporter.shutdown(timeout_millis=1000)


class ConsoleExporter:
    """Prints each exported span as one JSON line (decoded by the official proto classes)."""

    endpoint = "console"

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out or sys.stdout

    def export(self, batch: EncodedBatch) -> bool:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        req = ExportTraceServiceRequest.FromString(batch.data)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self._out.write(json.dumps(MessageToDict(s)) + "\n")
        self._out.flush()
        return True

    def shutdown(self) -> None:
        return None


class SpanQueue:
    """Bounded queue + worker thread (the BatchSpanProcessor's job, for encoded spans)."""

    def __init__(
        self,
        exporter: BatchExporter,
        encoder: RequestEncoder,
        *,
        max_queue_size: int,
        max_batch: int,
        schedule_delay_s: float,
    ) -> None:
        self.exporter = exporter
        self._encoder = encoder
        self._queue: collections.deque[bytes] = collections.deque()
        self._max_queue = max_queue_size
        self._max_batch = max_batch
        self._delay = schedule_delay_s
        self._wake = threading.Event()
        self._stopping = False
        #: counters, read by /readyz and (later) /metrics
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self.last_error_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="gateway-span-export", daemon=True)
        self._thread.start()

    def put(self, spans: Sequence[bytes]) -> None:
        """Called on the event loop: never blocks, never does I/O."""
        q = self._queue
        room = self._max_queue - len(q)
        if room < len(spans):
            self.dropped += len(spans) - max(room, 0)
            spans = spans[: max(room, 0)]
        q.extend(spans)
        if len(q) >= self._max_batch:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            while self._queue:
                self._export_some()
                if self._stopping:
                    break
            if self._stopping:
                return

    def _export_some(self) -> None:
        q = self._queue
        batch: list[bytes] = []
        while q and len(batch) < self._max_batch:
            batch.append(q.popleft())
        if not batch:
            return
        ok = False
        try:
            ok = self.exporter.export(EncodedBatch(self._encoder.request(batch), len(batch)))
        except Exception:  # the exporter must never kill the worker
            log.exception("span export failed")
        if ok:
            self.exported += len(batch)
        else:
            self.failed += len(batch)
            self.last_error_at = time.time()

    def state(self) -> str:
        if self.last_error_at is not None and time.time() - self.last_error_at < 30:
            return "failing"
        return "ok"

    def shutdown(self, timeout_s: float) -> None:
        """Flush what is queued, waiting at most ``timeout_s``; then drop the rest."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while self._queue and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.01)
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self.dropped += len(self._queue)
        self._queue.clear()
        try:
            self.exporter.shutdown()
        except Exception:
            log.exception("span exporter shutdown failed")
