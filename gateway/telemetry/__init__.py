"""Telemetry from one Timeline (docs/spec.md §6, §7, §11): headers at start, spans and logs at the
end.

:class:`Telemetry` is the one place the request path talks to: :meth:`Telemetry.begin` fixes the
trace ids as the request arrives, :meth:`Telemetry.headers_at_start` is the response writer's
header hook (``Server-Timing``, ``traceresponse``), and :meth:`Telemetry.finish` hands the
finished request to every sink (spans, access log, ...), each reading the same Timeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.context import RequestContext
from gateway.telemetry.logs import AccessLog
from gateway.telemetry.loop_lag import LoopLag
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.server_timing import edge_intervals, server_timing
from gateway.telemetry.spans import EdgeHop
from gateway.telemetry.tracing import DROPPED, KEPT, Tracing
from gateway.types import RawHeaders

#: something told about every finished request (metrics, the live view, ...)
Sink = Callable[[RequestContext, list[EdgeHop]], None]


class Telemetry:
    def __init__(
        self,
        tracing: Tracing,
        access_log: AccessLog,
        sinks: Sequence[Sink] = (),
        metrics: Metrics | None = None,
        loop_lag: LoopLag | None = None,
    ) -> None:
        self.tracing = tracing
        self.access_log = access_log
        self.metrics = metrics
        self._sinks: tuple[Sink, ...] = (metrics, *sinks) if metrics is not None else tuple(sinks)
        if tracing.genai_metrics is not None:  # the GenAI client metrics over OTLP (§7)
            self._sinks += (tracing.genai_metrics,)
        self._traced = tracing.enabled
        self._capture = tracing.capture_content
        #: the event loop's lag, for the metric and the root span (None: neither is on)
        self.loop_lag: LoopLag | None = loop_lag
        if loop_lag is None and (metrics is not None or self._traced):
            self.loop_lag = LoopLag(metrics.loop_lag if metrics is not None else None)

    def with_sinks(self, sinks: Sequence[Sink]) -> Telemetry:
        """The same tracing, access log, metrics and lag monitor, telling other sinks (a
        reloaded config's, docs/spec.md §29)."""
        return Telemetry(self.tracing, self.access_log, sinks, self.metrics, self.loop_lag)

    def start(self) -> None:
        """Background work on the running loop: the lag monitor."""
        if self.loop_lag is not None:
            self.loop_lag.start()

    def begin(self, ctx: RequestContext) -> None:
        """Trace ids for a new request; when not tracing, stay transparent to the client's."""
        if self.metrics is not None:
            self.metrics.begin(ctx)  # in flight until finish()
        if self._traced:
            self.tracing.begin(ctx, ctx.incoming_trace)
            if self._capture:
                ctx.answer.captured = []
        elif ctx.incoming_trace is not None:
            tp, ts = ctx.incoming_trace
            ctx.upstream_headers.append(("traceparent", tp.decode("latin-1")))
            if ts:
                ctx.upstream_headers.append(("tracestate", ts.decode("latin-1")))

    def headers_at_start(self, ctx: RequestContext) -> RawHeaders:
        """Headers derived from the Timeline as the response starts (docs/spec.md §6)."""
        headers: RawHeaders = [(b"server-timing", server_timing(ctx, edge_intervals(ctx)))]
        if self._traced:
            tr = self.tracing.traceresponse(ctx)
            if tr is not None:
                headers.append(tr)
        return headers

    def finish(self, ctx: RequestContext) -> None:
        # one decision as the request ends (ratio, parent, keep rules): spans, the access log's
        # sampling, exemplars and the live view all follow it (docs/spec.md §7)
        kept = self.tracing.keep(ctx) if self._traced else DROPPED
        if kept and self.loop_lag is not None:
            ctx.timeline.loop_lag = self.loop_lag.worst_since(ctx.timeline.received)  # for spans
        edges = edge_intervals(ctx)
        if kept:
            self.tracing.finish(ctx, edges)
        self.access_log.record(ctx, kept == KEPT)
        for sink in self._sinks:
            sink(ctx, edges)

    def stop(self) -> None:
        """End the background work :meth:`start` began (on the loop that runs it)."""
        if self.loop_lag is not None:
            self.loop_lag.stop()

    def shutdown(self) -> None:
        self.tracing.shutdown()


__all__ = ["Sink", "Telemetry"]
