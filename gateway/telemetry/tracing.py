"""Spans from the Timeline (SPEC §7): one SERVER root, one span per hop, one CLIENT per attempt.

Spans are not opened and closed live around the code: every timing is already on the
request's :class:`~gateway.context.Timeline`, so when the request is done the whole span tree
is written in one go with explicit start/end times (edge hops are reconstructed from headers
anyway). That keeps the hot path free of span objects and context switches, and makes the
spans agree exactly with ``Server-Timing`` and the access log. Only the ids are chosen up front:
the trace id (continued from an incoming ``traceparent`` when trusted), the root span id (for
``traceresponse``) and one span id per attempt (injected upstream as its ``traceparent``).

Sampling is ``ParentBased(TraceIdRatioBased(sample_ratio))``, computed with the SDK's own bound.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway import __version__
from gateway.config import TracingConfig
from gateway.memo import remember
from gateway.telemetry import otlp
from gateway.telemetry.export import (
    BatchExporter,
    ConsoleExporter,
    OTLPGrpcExporter,
    OTLPHttpExporter,
    SpanQueue,
)

if TYPE_CHECKING:
    from gateway.context import Attempt, RequestContext

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACE_ID_LIMIT = (1 << 64) - 1
SCOPE_NAME = "llm-gateway"


class TraceContext:
    """The ids of one request's trace, fixed when the request arrives."""

    __slots__ = ("flags", "parent_span_id", "root_span_id", "sampled", "trace_id", "trace_state")

    def __init__(
        self,
        trace_id: int,
        root_span_id: int,
        parent_span_id: int | None,
        sampled: bool,
        trace_state: str,
    ) -> None:
        self.trace_id = trace_id
        self.root_span_id = root_span_id
        self.parent_span_id = parent_span_id
        self.sampled = sampled
        self.flags = "01" if sampled else "00"
        self.trace_state = trace_state

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.trace_id:032x}-{span_id:016x}-{self.flags}"


def parse_traceparent(value: bytes) -> tuple[int, int, bool] | None:
    """W3C Trace Context §3.2: (trace_id, parent_id, sampled), or None when invalid."""
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None:
        return None
    version, trace_id, parent_id, flags, rest = m.groups()
    if version == b"ff" or (version == b"00" and rest):
        return None
    tid, pid = int(trace_id, 16), int(parent_id, 16)
    if tid == 0 or pid == 0:
        return None
    return tid, pid, bool(int(flags, 16) & 1)


def _span_id() -> int:
    while True:
        sid = random.getrandbits(64)
        if sid:
            return sid


class Tracing:
    """Per-app tracing state: sampler bound, encoder, export queue. No per-request state."""

    def __init__(
        self,
        cfg: TracingConfig,
        *,
        edge_hop_count: int = 0,
        cache_backend: str = "memory",
        exporter: BatchExporter | None = None,
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

        self.cfg = cfg
        #: hop.index of auth is edge_hop_count + 1, of router + 2 (SPEC §7)
        self.edge_hop_count = edge_hop_count
        self.cache_backend = cache_backend
        self.enabled = cfg.exporter != "none"
        self.capture_content = cfg.capture_content
        self._bound = TraceIdRatioBased.get_bound_for_rate(cfg.sample_ratio)
        self.queue: SpanQueue | None = None
        if not self.enabled:
            return
        service = cfg.service_name
        if service == "llm-gateway" and os.environ.get("OTEL_SERVICE_NAME"):
            service = os.environ["OTEL_SERVICE_NAME"]
        # Resource.create adds the SDK's defaults and OTEL_RESOURCE_ATTRIBUTES
        resource = Resource.create({"service.name": service, "service.version": __version__})
        attrs: dict[str, otlp.AttrValue] = {
            k: v for k, v in resource.attributes.items() if isinstance(v, str | bool | int | float)
        }
        encoder = otlp.RequestEncoder(attrs, SCOPE_NAME, __version__)
        if exporter is None:
            exporter = make_exporter(cfg)
        self.queue = SpanQueue(
            exporter,
            encoder,
            max_queue_size=cfg.max_queue_size,
            max_batch=cfg.max_export_batch_size,
            schedule_delay_s=cfg.schedule_delay_ms / 1000,
        )

    # ------------------------------------------------------------ per request

    def begin(self, ctx: RequestContext, incoming: tuple[bytes, bytes | None] | None) -> None:
        """Fix the trace ids of a request (continuing a trusted incoming ``traceparent``)."""
        parent: tuple[int, int, bool] | None = None
        if incoming is not None and self.cfg.trust_incoming:
            parent = parse_traceparent(incoming[0])
        if parent is not None:
            trace_id, parent_id, parent_sampled = parent
            sampled = parent_sampled  # ParentBased: follow the remote parent's decision
            state = incoming[1].decode("latin-1") if incoming and incoming[1] else ""
        else:
            trace_id = random.getrandbits(128) or 1
            parent_id = None
            sampled = self.sample(trace_id)
            state = ""
        ctx.trace = TraceContext(trace_id, _span_id(), parent_id, sampled and self.enabled, state)

    def sample(self, trace_id: int) -> bool:
        """The root decision of TraceIdRatioBased: the low 64 bits against the SDK's bound."""
        return (trace_id & _TRACE_ID_LIMIT) < self._bound

    def attempt_headers(self, ctx: RequestContext, attempt: Attempt) -> list[tuple[str, str]]:
        trace: TraceContext = ctx.trace
        headers = [("traceparent", trace.traceparent(attempt.span_id))]
        if trace.trace_state:
            headers.append(("tracestate", trace.trace_state))
        return headers

    def new_span_id(self) -> int:
        return _span_id()

    def traceresponse(self, ctx: RequestContext) -> tuple[bytes, bytes] | None:
        trace: TraceContext | None = ctx.trace
        if trace is None or not self.enabled:
            return None
        return (b"traceresponse", trace.traceparent(trace.root_span_id).encode())

    def finish(self, ctx: RequestContext, edge_hops: list[tuple[str, int, float, float]]) -> None:
        trace: TraceContext | None = ctx.trace
        if trace is None or not trace.sampled or self.queue is None:
            return
        self.queue.put(build_spans(ctx, trace, edge_hops, self.edge_hop_count, self.cache_backend))

    def state(self) -> dict[str, Any]:
        if self.queue is None:
            return {"exporter": "none"}
        q = self.queue
        return {
            "exporter": self.cfg.exporter,
            "endpoint": getattr(q.exporter, "endpoint", ""),
            "state": q.state(),
            "exported": q.exported,
            "failed": q.failed,
            "dropped": q.dropped,
        }

    def shutdown(self) -> None:
        if self.queue is not None:
            self.queue.shutdown(self.cfg.shutdown_timeout_s)


def make_exporter(cfg: TracingConfig) -> BatchExporter:
    timeout = cfg.export_timeout_s
    if cfg.exporter == "console":
        return ConsoleExporter()
    if cfg.protocol == "grpc":
        return OTLPGrpcExporter(cfg.endpoint, timeout)
    return OTLPHttpExporter(cfg.endpoint, timeout)


# ---------------------------------------------------------------- building the span tree

_a = otlp.attr
_s = otlp.stable_attr
_f = otlp.float_attr
_str = otlp.str_attr
#: sampled (W3C flag 01) + "parent is local" for every span but the root
_FLAGS = otlp.FLAG_HAS_IS_REMOTE | 0x01


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _group(key: tuple[Any, ...], names: tuple[str, ...]) -> bytes:
    """Stable attributes as one memoised block (one dict lookup for the whole group)."""
    got = _GROUPS.get(key)
    if got is None:
        encoded = b"".join(_s(n, v) for n, v in zip(names, key, strict=True) if v is not None)
        got = remember(_GROUPS, key, encoded, 4096)
    return got


_GROUPS: dict[tuple[Any, ...], bytes] = {}
_ROOT_NAMES = (
    "http.request.method",
    "url.path",
    "http.route",
    "http.response.status_code",
    "client.address",
    "gateway.cache",
    "gateway.route",
    "gen_ai.request.model",
    "gateway.tenant",
    "gateway.attempts",
)
_CLIENT_NAMES = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.request.stream",
    "server.address",
    "server.port",
    "gateway.backend",
    "gateway.attempt",
    "http.response.status_code",
)
_HOP_NAMES = ("hop.name", "hop.index", "hop.source")
_AUTH_NAMES = (*_HOP_NAMES, "gateway.auth.mode")
_ROUTER_NAMES = (*_HOP_NAMES, "gateway.cache", "gateway.route")


_ZERO_ID = bytes(8)


def _sid() -> bytes:
    sid = random.randbytes(8)
    while sid == _ZERO_ID:  # an all-zero span id is invalid (W3C Trace Context)
        sid = random.randbytes(8)
    return sid


_AUTH = otlp.name_kind("hop auth", otlp.KIND_INTERNAL)
_ROUTER = otlp.name_kind("hop router", otlp.KIND_INTERNAL)


def build_spans(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[tuple[str, int, float, float]],
    hop_base: int,
    cache_backend: str = "memory",
) -> list[bytes]:
    """The encoded span tree of one finished request (SPEC §7).

    Runs once per sampled request on the event loop, after the response went out: it uses the
    memoised pieces of :mod:`gateway.telemetry.otlp` so only times, ids and numbers are encoded.
    """
    t = ctx.timeline
    received = t.received
    wall = t.wall_ns
    done = t.done if t.done is not None else received
    head = otlp.span_head(trace.trace_id.to_bytes(16, "big"))
    root_id = trace.root_span_id.to_bytes(8, "big")
    under_root = otlp.parent_field(root_id)
    tail = otlp.tail(otlp.STATUS_UNSET, _FLAGS)
    fast = otlp.span_fast
    spans: list[bytes] = []

    # edge hops, reconstructed from their headers (start/end are epoch seconds)
    root_start_ns = wall
    for name, index, start_s, end_s in edge_hops:
        start_ns = int(start_s * 1e9)
        root_start_ns = min(root_start_ns, start_ns)
        spans.append(
            fast(
                head,
                _sid(),
                under_root,
                otlp.name_kind(f"hop {name}", otlp.KIND_INTERNAL),
                start_ns,
                int(end_s * 1e9),
                (_group((name, index, "header"), _HOP_NAMES),),
                tail,
            )
        )
    auth_end = t.auth_done if t.auth_done is not None else done
    spans.append(
        fast(
            head,
            _sid(),
            under_root,
            _AUTH,
            wall,
            wall + int((auth_end - received) * 1e9),
            (_group(("auth", hop_base + 1, "gateway", "off"), _AUTH_NAMES),),
            tail,
        )
    )
    if t.auth_done is not None:
        router_id = _sid()
        router_end = t.routed
        if router_end is None:
            router_end = ctx.attempts[0].start if ctx.attempts else done
        router_attrs = [
            _group(
                (
                    "router",
                    hop_base + 2,
                    "gateway",
                    ctx.cache,
                    ctx.route.name if ctx.route is not None else None,
                ),
                _ROUTER_NAMES,
            )
        ]
        if t.body_received is not None:
            router_attrs.append(_f("gateway.body_read_ms", _ms(t.body_received - t.auth_done)))
            router_attrs.append(_s("gateway.request.body_bytes", len(ctx.body)))
        for key, value in ctx.policies.items():
            router_attrs.append(_a(f"gateway.{key}", value))
        spans.append(
            fast(
                head,
                router_id,
                under_root,
                _ROUTER,
                wall + int((t.auth_done - received) * 1e9),
                wall + int((router_end - received) * 1e9),
                router_attrs,
                tail,
            )
        )
        if ctx.cache_lookup_start is not None:
            spans.append(
                _cache_span(
                    ctx,
                    head,
                    otlp.parent_field(router_id),
                    "cache lookup",
                    t.epoch_ns,
                    ctx.cache_lookup_start,
                    ctx.cache_lookup_end or done,
                    cache_backend,
                )
            )
    if ctx.cache_store_start is not None:
        spans.append(
            _cache_span(
                ctx,
                head,
                under_root,
                "cache store",
                t.epoch_ns,
                ctx.cache_store_start,
                ctx.cache_store_end or done,
                cache_backend,
            )
        )

    # one CLIENT span per upstream attempt
    payload = ctx.payload or {}
    model = ctx.model or ""
    last = ctx.attempts[-1] if ctx.attempts else None
    client_name = otlp.name_kind(f"{ctx.operation or ctx.method} {model}".strip(), otlp.KIND_CLIENT)
    for attempt in ctx.attempts:
        b = attempt.backend
        end = attempt.end if attempt.end is not None else done
        attrs = [
            _group(
                (
                    ctx.operation or "http",
                    b.provider,
                    model,
                    ctx.stream,
                    b.host,
                    b.port,
                    b.name,
                    attempt.number,
                    attempt.status,
                ),
                _CLIENT_NAMES,
            )
        ]
        v = payload.get("max_tokens")
        if v is None:
            v = payload.get("max_completion_tokens")
        if type(v) is int:
            attrs.append(_s("gen_ai.request.max_tokens", v))
        v = payload.get("temperature")
        if type(v) is int or type(v) is float:
            attrs.append(_f("gen_ai.request.temperature", float(v)))
        status = otlp.STATUS_UNSET
        message = ""
        if attempt.status is not None and attempt.status >= 500:
            status = otlp.STATUS_ERROR
        if attempt.error is not None:
            status = otlp.STATUS_ERROR
            message = attempt.error.message
            attrs.append(_s("error.type", attempt.error.code or attempt.error.type))
        if attempt is last:
            if ctx.response_model:
                attrs.append(_s("gen_ai.response.model", ctx.response_model))
            if ctx.response_id:
                attrs.append(_str("gen_ai.response.id", ctx.response_id))
            if ctx.finish_reasons:
                attrs.append(_a("gen_ai.response.finish_reasons", list(ctx.finish_reasons)))
            if t.first_content is not None:
                attrs.append(
                    _f(
                        "gen_ai.response.time_to_first_chunk",
                        round(t.first_content - attempt.start, 6),
                    )
                )
            if ctx.input_tokens is not None:
                attrs.append(_s("gen_ai.usage.input_tokens", ctx.input_tokens))
            if ctx.output_tokens is not None:
                attrs.append(_s("gen_ai.usage.output_tokens", ctx.output_tokens))
            if ctx.error is not None and ctx.response_started:
                status = otlp.STATUS_ERROR
                message = ctx.error.message
                attrs.append(_s("error.type", ctx.error.code or ctx.error.type))
            if ctx.captured is not None:
                attrs.extend(_content_attrs(ctx))
        spans.append(
            fast(
                head,
                attempt.span_id.to_bytes(8, "big"),
                under_root,
                client_name,
                wall + int((attempt.start - received) * 1e9),
                wall + int((end - received) * 1e9),
                attrs,
                otlp.tail(status, _FLAGS, message),
            )
        )

    # the root SERVER span: from the first edge hop's start (or receipt) to the last byte
    upstream_s = ctx.upstream_time(done)
    request_s = done - received
    route = _route_template(ctx.path)
    root_attrs = [
        _group(
            (
                ctx.method,
                ctx.path,
                route,
                ctx.status,
                ctx.client_address,
                ctx.cache,
                ctx.route.name if ctx.route is not None else None,
                ctx.model,
                ctx.tenant,
                len(ctx.attempts),
            ),
            _ROOT_NAMES,
        ),
        _f("gateway.request_time_ms", _ms(request_s)),
        _f("gateway.upstream_time_ms", _ms(upstream_s)),
        _f("gateway.overhead_ms", _ms(max(0.0, request_s - upstream_s))),
        _str("gateway.request_id", ctx.request_id),
    ]
    ttft = ctx.ttft()
    if ttft is not None:
        root_attrs.append(_f("gateway.ttft_ms", _ms(ttft)))
    if ctx.input_tokens is not None:
        root_attrs.append(_s("gen_ai.usage.input_tokens", ctx.input_tokens))
    if ctx.output_tokens is not None:
        root_attrs.append(_s("gen_ai.usage.output_tokens", ctx.output_tokens))
    if ctx.edge_marks:
        root_attrs.append(
            _a("gateway.edge.discarded", [f"{k}:{v}" for k, v in ctx.edge_marks.items()])
        )
    if edge_hops:
        root_attrs.append(_f("gateway.edge_time_ms", _ms(wall / 1e9 - edge_hops[0][2])))
    status = otlp.STATUS_UNSET
    message = ""
    if ctx.status >= 500:
        status = otlp.STATUS_ERROR
    if ctx.error is not None:
        root_attrs.append(_s("error.type", ctx.error.code or ctx.error.type))
        message = ctx.error.message
        if ctx.error.status >= 500:
            status = otlp.STATUS_ERROR
    if ctx.disconnected:
        root_attrs.append(_s("gateway.client_disconnected", True))
    root_flags = _FLAGS | (otlp.FLAG_IS_REMOTE if trace.parent_span_id else 0)
    root_head = otlp.span_head(trace.trace_id.to_bytes(16, "big"), trace.trace_state)
    parent = trace.parent_span_id.to_bytes(8, "big") if trace.parent_span_id else None
    spans.append(
        fast(
            root_head,
            root_id,
            otlp.parent_field(parent),
            otlp.name_kind(f"{ctx.method} {route}", otlp.KIND_SERVER),
            root_start_ns,
            wall + int(request_s * 1e9),
            root_attrs,
            otlp.tail(status, root_flags, message),
        )
    )
    return spans


def _cache_span(
    ctx: RequestContext,
    head: bytes,
    parent: bytes,
    name: str,
    epoch: Callable[[float], int],
    start: float,
    end: float,
    backend: str,
) -> bytes:
    attrs = [_s("gateway.cache", ctx.cache), _s("gateway.cache.backend", backend)]
    if backend == "redis":
        attrs.append(_s("db.system.name", "redis"))
    if ctx.cache_error:
        attrs.append(_s("error.type", "cache_unavailable"))
    if ctx.cache_stored is not None and name == "cache store":
        attrs.append(_s("gateway.cache.entry_bytes", ctx.cache_stored))
    status = otlp.STATUS_ERROR if ctx.cache_error else otlp.STATUS_UNSET
    return otlp.span_fast(
        head,
        _sid(),
        parent,
        otlp.name_kind(name, otlp.KIND_INTERNAL),
        epoch(start),
        epoch(end),
        attrs,
        otlp.tail(status, _FLAGS),
    )


def _route_template(path: str) -> str:
    if path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        return path
    return "/v1/{path}" if path.startswith("/v1/") else path


def _content_attrs(ctx: RequestContext) -> list[bytes]:
    """Prompts and completions, only with ``tracing.capture_content = true`` (SPEC §7)."""
    import orjson

    out = []
    payload = ctx.payload or {}
    prompt = payload.get("messages", payload.get("prompt", payload.get("input")))
    if prompt is not None:
        out.append(_a("gen_ai.input.messages", orjson.dumps(prompt).decode()))
    if ctx.captured:
        out.append(_a("gen_ai.output.messages", "".join(ctx.captured)))
    return out
