"""The metrics of what the gateway serves beside the model call, each group its own series:
spend (docs/spec.md §20), stateful calls (§24), realtime sessions (§19), MCP requests (§23)."""

from __future__ import annotations

from gateway.context import RequestContext
from gateway.telemetry.metrics.series import DURATION_BUCKETS, FINE_BUCKETS, Counter, Histogram


class SpendMetrics:
    """docs/spec.md §20: what the upstreams' usage cost, and the answers nobody priced."""

    __slots__ = ("cost", "unpriced")

    def __init__(self) -> None:
        self.cost = Counter(
            "gateway_cost_usd", "USD the upstreams' usage cost", ("route", "model", "tenant")
        )
        self.unpriced = Counter(
            "gateway_unpriced_requests", "Upstream answers of models without a price", ("model",)
        )

    @property
    def counters(self) -> tuple[Counter, ...]:
        return self.cost, self.unpriced


class ObjectMetrics:
    """docs/spec.md §24: the stateful calls' streamed bytes and durations, by route and
    operation (``files.create``, ``files.content``, ``message_batches.results``, …)."""

    __slots__ = ("bytes", "duration")

    def __init__(self) -> None:
        self.bytes = Counter(
            "gateway_object_bytes",
            "Bytes of files and results streamed by stateful calls (upload: to the backend, "
            "download: to the client)",
            ("route", "operation", "direction"),
        )
        self.duration = Histogram(
            "gateway_object_duration_seconds",
            "Time of each stateful call (files, uploads, batches, conversations, vector "
            "stores), first request byte to last response byte",
            ("route", "operation"),
            DURATION_BUCKETS,
        )

    def observe(self, ctx: RequestContext, seconds: float, trace_id: int | None) -> None:
        call = ctx.object_call
        if call is None:
            return
        route, operation = call
        self.duration.observe(call, seconds, trace_id)
        if ctx.upload_bytes is not None:
            self.bytes.inc((route, operation, "upload"), ctx.upload_bytes)
        if ctx.download_bytes is not None:
            self.bytes.inc((route, operation, "download"), ctx.download_bytes)


class RealtimeMetrics:
    """The realtime sessions of one process: open now (``gateway_realtime_sessions``), ended
    by close code, and the per-message overhead in each direction (from a message's last byte
    read on one side to its write on the other)."""

    __slots__ = ("message_overhead", "open", "sessions")

    DIRECTIONS = ("client_to_upstream", "upstream_to_client")

    def __init__(self) -> None:
        self.open = 0
        # an untyped family named in full: a counter family would be
        # "gateway_realtime_sessions" in OpenMetrics, the gauge's name (a clash that fails the
        # whole scrape); its samples are the same, and rate() reads them as a counter's
        self.sessions = Counter(
            "gateway_realtime_sessions_total",
            "Realtime sessions ended, by close code",
            ("close_code",),
            untyped=True,
        )
        self.message_overhead = Histogram(
            "gateway_realtime_message_overhead_seconds",
            "Per-message delay the gateway adds to a realtime session (read to written)",
            ("direction",),
            FINE_BUCKETS,
        )


class McpMetrics:
    """MCP requests through the gateway (docs/spec.md §23), one per JSON-RPC message."""

    __slots__ = ("duration", "requests")

    def __init__(self) -> None:
        self.requests = Counter(
            "gateway_mcp_requests",
            "MCP JSON-RPC requests, by server, method, tool and outcome",
            ("server", "method", "tool", "status"),
        )
        self.duration = Histogram(
            "gateway_mcp_request_duration_seconds",
            "Time from an MCP request's first byte to its answer's last byte",
            ("server", "method"),
            DURATION_BUCKETS,
        )


class A2aMetrics:
    """A2A calls through the gateway (docs/spec.md §30), one per HTTP request."""

    __slots__ = ("duration", "requests")

    def __init__(self) -> None:
        self.requests = Counter(
            "gateway_a2a_requests",
            "A2A calls, by agent, method and outcome",
            ("agent", "method", "status"),
        )
        self.duration = Histogram(
            "gateway_a2a_request_duration_seconds",
            "Time from an A2A call's first byte to its answer's last byte (a stream's end)",
            ("agent", "method"),
            DURATION_BUCKETS,
        )


__all__ = ["A2aMetrics", "McpMetrics", "ObjectMetrics", "RealtimeMetrics", "SpendMetrics"]
