"""The spans of a realtime session, from its Timeline (docs/spec.md §7, §19).

::

    GET /v1/realtime                 SERVER  the whole session (received → closed)
    ├── hop <edge>…, hop intake, hop auth, hop router
    ├── realtime <model>             CLIENT  one per handshake attempt (attempt start → its
    │                                        101 or its failure); its id went upstream as
    │                                        ``traceparent``
    └── realtime response            one per model response, response.created → response.done
                                     (exported as each response ends: a session may last hours)

Written with :mod:`gateway.telemetry.otlp`'s encoder, like every other span of the gateway.
"""

from __future__ import annotations

import random

from gateway.budgets.spend import cost
from gateway.context import Attempt, RequestContext, TraceContext
from gateway.realtime.events import ModelResponse
from gateway.realtime.message_relay import Stats
from gateway.telemetry import otlp
from gateway.telemetry.spans import EdgeHop

ROUTE = "/v1/realtime"
OPERATION = "realtime"
_a = otlp.attr
_f = otlp.float_attr
_s = otlp.stable_attr
_str = otlp.str_attr
_LOCAL = otlp.FLAG_HAS_IS_REMOTE | 0x01


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _sid() -> bytes:
    sid = random.randbytes(8)
    while sid == bytes(8):
        sid = random.randbytes(8)
    return sid


class SessionFacts:
    """What the session adds to its context for telemetry (the relay's counters, the end)."""

    __slots__ = (
        "accepted",
        "by",
        "close_code",
        "close_reason",
        "handshake_done",
        "max_in",
        "max_out",
        "mean_in",
        "mean_out",
        "messages_in",
        "messages_out",
        "responses",
    )

    def __init__(self) -> None:
        self.accepted: float | None = None
        #: when the successful handshake attempt got its 101 (the CLIENT span's end)
        self.handshake_done: float | None = None
        self.messages_in = self.messages_out = self.responses = 0
        self.close_code: int | None = None
        self.close_reason = ""
        self.by = ""
        self.mean_in = self.mean_out = self.max_in = self.max_out = 0.0

    def count(self, stats: Stats) -> None:
        """The relay's counters, once it is done."""
        self.messages_in, self.messages_out = stats.messages_in, stats.messages_out
        self.max_in, self.max_out = stats.max_in, stats.max_out
        self.mean_in = stats.overhead_in / stats.messages_in if stats.messages_in else 0.0
        self.mean_out = stats.overhead_out / stats.messages_out if stats.messages_out else 0.0


class _SessionTree:
    __slots__ = ("done", "head", "received", "root", "under_root", "wall")

    def __init__(self, ctx: RequestContext, trace: TraceContext) -> None:
        t = ctx.timeline
        self.received = t.received
        self.wall = t.wall_ns
        self.done = t.done if t.done is not None else t.received
        self.head = otlp.span_head(trace.trace_id.to_bytes(16, "big"))
        self.root = trace.root_span_id.to_bytes(8, "big")
        self.under_root = otlp.parent_field(self.root)

    def ns(self, t: float) -> int:
        return self.wall + int((t - self.received) * 1e9)

    def child(
        self,
        name: str,
        kind: int,
        start: float,
        end: float,
        attrs: list[bytes],
        status: int = otlp.STATUS_UNSET,
        message: str = "",
        span_id: bytes | None = None,
    ) -> bytes:
        return otlp.span_fast(
            self.head,
            span_id or _sid(),
            self.under_root,
            otlp.name_kind(name, kind),
            self.ns(start),
            self.ns(end),
            attrs,
            otlp.tail(status, _LOCAL, message),
        )


def session_spans(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    hop_base: int,
    facts: SessionFacts,
    auth_mode: str,
) -> list[bytes]:
    """The session's spans but its responses' (those went out as each ended)."""
    tree = _SessionTree(ctx, trace)
    t = ctx.timeline
    spans = [
        otlp.span_fast(
            tree.head,
            _sid(),
            tree.under_root,
            otlp.name_kind(f"hop {name}", otlp.KIND_INTERNAL),
            int(start * 1e9),
            int(end * 1e9),
            [_s("hop.name", name), _s("hop.index", index), _s("hop.source", "header")],
            otlp.tail(otlp.STATUS_UNSET, _LOCAL),
        )
        for name, index, start, end in edge_hops
    ]

    def hop(name: str, index: int, start: float, end: float, *extra: bytes) -> None:
        attrs = [_s("hop.name", name), _s("hop.index", index), _s("hop.source", "gateway")]
        spans.append(tree.child(f"hop {name}", otlp.KIND_INTERNAL, start, end, [*attrs, *extra]))

    hop("intake", hop_base + 1, t.received, t.intake_done)
    auth_end = t.auth_done if t.auth_done is not None else tree.done
    tenant = [_s("gateway.tenant", ctx.tenant)] if ctx.tenant is not None else []
    hop("auth", hop_base + 2, t.intake_done, auth_end, _s("gateway.auth.mode", auth_mode), *tenant)
    if t.auth_done is not None:
        routed = t.routed if t.routed is not None else tree.done
        route = [_s("gateway.route", ctx.call.route.name)] if ctx.call is not None else []
        hop("router", hop_base + 3, t.auth_done, routed, *route)
    last = ctx.attempts[-1] if ctx.attempts else None
    for attempt in ctx.attempts:
        end = facts.handshake_done if attempt is last and facts.accepted else attempt.end
        spans.append(_attempt_span(tree, ctx, attempt, end if end is not None else tree.done))
    spans.append(_root(tree, ctx, trace, edge_hops, facts))
    return spans


def _attempt_span(tree: _SessionTree, ctx: RequestContext, attempt: Attempt, end: float) -> bytes:
    b = attempt.backend
    model = ctx.model or ""
    attrs = [
        _s("gen_ai.operation.name", OPERATION),
        _s("gen_ai.provider.name", b.provider),
        _s("gen_ai.request.model", model),
        _s("server.address", b.host),
        _s("server.port", b.port),
        _s("gateway.backend", b.name),
        _s("gateway.attempt", attempt.number),
    ]
    if attempt.status is not None:
        attrs.append(_s("http.response.status_code", attempt.status))
    status, message = otlp.STATUS_UNSET, ""
    if attempt.error is not None:
        status, message = otlp.STATUS_ERROR, attempt.error.message
        attrs.append(_s("error.type", attempt.error.code or attempt.error.type))
    return tree.child(
        f"{OPERATION} {model}".strip(),
        otlp.KIND_CLIENT,
        attempt.start,
        end,
        attrs,
        status,
        message,
        span_id=attempt.span_id.to_bytes(8, "big"),
    )


def _root(
    tree: _SessionTree,
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    facts: SessionFacts,
) -> bytes:
    answer = ctx.answer
    t = ctx.timeline
    setup_end = facts.accepted if facts.accepted is not None else tree.done
    last = ctx.attempts[-1] if ctx.attempts else None
    setup_upstream = 0.0
    for a in ctx.attempts:
        end = facts.handshake_done if a is last and facts.handshake_done is not None else a.end
        setup_upstream += (end if end is not None else setup_end) - a.start
    attrs = [
        _s("http.request.method", "GET"),
        _s("url.path", ctx.path),
        _s("url.scheme", ctx.scope.get("scheme", "ws")),
        _s("http.route", ROUTE),
        _s("http.response.status_code", answer.status),
        _s("client.address", ctx.client_address),
        _s("gateway.attempts", len(ctx.attempts)),
        _f("gateway.request_time_ms", _ms(tree.done - tree.received)),
        # the gateway's own time to set the session up: received -> accepted, minus the
        # upstream handshakes and the backoff between them (the per-frame overhead is the
        # gateway_realtime_message_overhead_seconds histogram and the attributes below)
        _f(
            "gateway.overhead_ms",
            _ms(max(0.0, setup_end - tree.received - setup_upstream - t.backoff)),
        ),
        _str("gateway.request_id", ctx.request_id),
        _s("gateway.realtime.messages_in", facts.messages_in),
        _s("gateway.realtime.messages_out", facts.messages_out),
        _s("gateway.realtime.responses", facts.responses),
    ]
    attrs.extend(_context_attrs(ctx))
    attrs.extend(_session_attrs(facts))
    status, message = _root_status(ctx, facts, attrs)
    start_ns = tree.wall
    if edge_hops:
        start_ns = min(start_ns, int(edge_hops[0][2] * 1e9))
    flags = _LOCAL | (otlp.FLAG_IS_REMOTE if trace.parent_span_id else 0)
    parent = trace.parent_span_id.to_bytes(8, "big") if trace.parent_span_id else None
    return otlp.span_fast(
        otlp.span_head(trace.trace_id.to_bytes(16, "big"), trace.trace_state),
        tree.root,
        otlp.parent_field(parent),
        otlp.name_kind(f"GET {ROUTE}", otlp.KIND_SERVER),
        start_ns,
        tree.ns(tree.done),
        attrs,
        otlp.tail(status, flags, message),
    )


def _root_status(ctx: RequestContext, facts: SessionFacts, attrs: list[bytes]) -> tuple[int, str]:
    """The session's status (ERROR on a 5xx or a lost upstream) and message; adds error.type."""
    answer = ctx.answer
    status, message = otlp.STATUS_UNSET, ""
    error = answer.error
    if error is not None:
        attrs.append(_s("error.type", error.code or error.type))
        message = error.message
        if error.status >= 500:
            status = otlp.STATUS_ERROR
    elif facts.close_code == 1011:
        status, message = otlp.STATUS_ERROR, facts.close_reason or "upstream connection lost"
        attrs.append(_s("error.type", "upstream_connection_lost"))
    if answer.status >= 500:
        status = otlp.STATUS_ERROR
    return status, message


def _context_attrs(ctx: RequestContext) -> list[bytes]:
    attrs = []
    answer = ctx.answer
    if ctx.call is not None:
        attrs.append(_s("gateway.route", ctx.call.route.name))
    if ctx.model is not None:
        attrs.append(_s("gen_ai.request.model", ctx.model))
    if ctx.tenant is not None:
        attrs.append(_s("gateway.tenant", ctx.tenant))
    if ctx.timeline.backoff:
        attrs.append(_f("gateway.backoff_ms", _ms(ctx.timeline.backoff)))
    if answer.input_tokens is not None:
        attrs.append(_s("gen_ai.usage.input_tokens", answer.input_tokens))
    if answer.output_tokens is not None:
        attrs.append(_s("gen_ai.usage.output_tokens", answer.output_tokens))
    if answer.tokens.cached_input:
        attrs.append(_s("gen_ai.usage.cache_read.input_tokens", answer.tokens.cached_input))
    if answer.tokens.reasoning:
        attrs.append(_s("gen_ai.usage.reasoning.output_tokens", answer.tokens.reasoning))
    if ctx.conversation_id is not None:
        attrs.append(_str("gen_ai.conversation.id", ctx.conversation_id))
    usd = cost(ctx)  # the sum of its responses' (docs/spec.md §20)
    if usd is not None:
        attrs.append(_f("gateway.cost_usd", usd))
    return attrs


def _session_attrs(facts: SessionFacts) -> list[bytes]:
    attrs = []
    if facts.close_code is not None:
        attrs.append(_s("gateway.realtime.close_code", facts.close_code))
        attrs.append(_s("gateway.realtime.closed_by", facts.by))
        if facts.close_reason:
            attrs.append(_str("gateway.realtime.close_reason", facts.close_reason[:123]))
    if facts.messages_in:
        attrs.append(_f("gateway.realtime.overhead_in_mean_ms", _ms(facts.mean_in)))
        attrs.append(_f("gateway.realtime.overhead_in_max_ms", _ms(facts.max_in)))
    if facts.messages_out:
        attrs.append(_f("gateway.realtime.overhead_out_mean_ms", _ms(facts.mean_out)))
        attrs.append(_f("gateway.realtime.overhead_out_max_ms", _ms(facts.max_out)))
    return attrs


def response_span(
    ctx: RequestContext, trace: TraceContext, response: ModelResponse, provider: str
) -> bytes:
    """One ``realtime response`` span, a child of the session's root."""
    tree = _SessionTree(ctx, trace)
    attrs = [
        _s("gen_ai.operation.name", OPERATION),
        _s("gen_ai.provider.name", provider),
        _s("gen_ai.request.model", ctx.model or ""),
        _s("gateway.realtime.response_status", response.status),
    ]
    if response.id:
        attrs.append(_str("gen_ai.response.id", response.id))
    if ctx.conversation_id is not None:
        attrs.append(_str("gen_ai.conversation.id", ctx.conversation_id))
    ttft = response.ttft()
    if ttft is not None:
        attrs.append(_f("gateway.ttft_ms", _ms(ttft)))
    if response.input_tokens is not None:
        attrs.append(_s("gen_ai.usage.input_tokens", response.input_tokens))
    if response.cached_tokens is not None:
        attrs.append(_s("gen_ai.usage.cache_read.input_tokens", response.cached_tokens))
    if response.output_tokens is not None:
        attrs.append(_s("gen_ai.usage.output_tokens", response.output_tokens))
    if response.reasoning_tokens is not None:
        attrs.append(_s("gen_ai.usage.reasoning.output_tokens", response.reasoning_tokens))
    if response.cost_usd is not None:
        attrs.append(_f("gateway.cost_usd", response.cost_usd))
    status = otlp.STATUS_ERROR if response.status == "failed" else otlp.STATUS_UNSET
    end = response.done if response.done is not None else tree.done
    return tree.child(
        "realtime response",
        otlp.KIND_INTERNAL,
        response.created,
        end,
        attrs,
        status,
        span_id=response.span_id.to_bytes(8, "big") if response.span_id else None,
    )


__all__ = ["ROUTE", "SessionFacts", "response_span", "session_spans"]
