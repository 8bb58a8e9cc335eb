"""The per-request context and its Timeline: the single source of every timing (SPEC §6).

Hops fill the context in order (edge → auth → router → upstream → response) and never
reach back; spans, ``Server-Timing``, metrics and the access log are all derived from the
Timeline points below, so they cannot disagree.

Points (Envoy's names in brackets), ``time.perf_counter()`` seconds, ``None`` until reached::

    received            [DS_RX_BEG]  first ASGI event for the request
    body_received                    request body fully read
    auth_done                        key checked, tenant known
    routed                           body parsed, route chosen, cache looked up
    upstream_sent       [US_TX_BEG]  first attempt's request handed to the transport
    upstream_first_byte [US_RX_BEG]  response headers of the answering attempt
    upstream_done       [US_RX_END]  its body fully read (or the stream ended)
    client_first_byte   [DS_TX_BEG]  response headers sent to the client
    first_content                    first content-bearing SSE event sent (TTFT)
    done                [DS_TX_END]  last byte sent to the client
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.errors import GatewayError
    from gateway.hops.router import Route
    from gateway.hops.upstream import Backend
    from gateway.types import Scope


class Timeline:
    __slots__ = (
        "auth_done",
        "body_received",
        "client_first_byte",
        "done",
        "event_gaps",
        "first_content",
        "last_event",
        "received",
        "routed",
        "upstream_done",
        "upstream_first_byte",
        "upstream_sent",
        "wall_ns",
    )

    def __init__(self) -> None:
        self.wall_ns = time.time_ns()
        self.received = time.perf_counter()
        self.body_received: float | None = None
        self.auth_done: float | None = None
        self.routed: float | None = None
        self.upstream_sent: float | None = None
        self.upstream_first_byte: float | None = None
        self.upstream_done: float | None = None
        self.client_first_byte: float | None = None
        self.first_content: float | None = None
        self.last_event: float | None = None
        self.done: float | None = None
        #: seconds between consecutive SSE events relayed to the client
        self.event_gaps: list[float] = []

    def epoch_ns(self, t: float) -> int:
        """A perf_counter point as Unix epoch nanoseconds (for span timestamps)."""
        return self.wall_ns + int((t - self.received) * 1e9)

    def now_epoch(self) -> float:
        return self.wall_ns / 1e9 + (time.perf_counter() - self.received)


class Attempt:
    """One try of one backend; ``upstream_time`` sums them all (SPEC §6)."""

    __slots__ = ("backend", "end", "error", "first_byte", "number", "span_id", "start", "status")

    def __init__(self, backend: Backend, number: int, span_id: int) -> None:
        self.backend = backend
        self.number = number
        self.span_id = span_id
        self.start = time.perf_counter()
        self.first_byte: float | None = None
        self.end: float | None = None
        self.status: int | None = None
        self.error: GatewayError | None = None

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


class RequestContext:
    """What the hops establish about one request; data moves forward only."""

    __slots__ = (
        "accept_encoding",
        "attempts",
        "body",
        "cache",
        "cache_control",
        "cache_error",
        "cache_key",
        "cache_lookup_end",
        "cache_lookup_start",
        "cache_store_end",
        "cache_store_start",
        "cache_stored",
        "captured",
        "client_address",
        "coding",
        "content_encoding",
        "content_length",
        "credential",
        "disconnected",
        "edge_marks",
        "edge_times",
        "error",
        "finish_reasons",
        "forwarded_org",
        "incoming_trace",
        "input_tokens",
        "method",
        "model",
        "operation",
        "output_tokens",
        "path",
        "payload",
        "peer",
        "peer_trusted",
        "policies",
        "query",
        "request_id",
        "response_headers",
        "response_id",
        "response_model",
        "response_started",
        "route",
        "scope",
        "status",
        "stream",
        "tenant",
        "timeline",
        "trace",
        "upstream_headers",
    )

    def __init__(self, scope: Scope, timeline: Timeline) -> None:
        self.scope = scope
        self.timeline = timeline
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.query: bytes = scope.get("query_string", b"")
        self.request_id = ""
        client = scope.get("client")
        self.peer: str = client[0] if client else ""
        self.client_address: str = self.peer
        self.peer_trusted = False
        #: headers to send upstream (hygiene applied), as str pairs for the client libraries
        self.upstream_headers: list[tuple[str, str]] = []
        #: the client's API key (Authorization bearer or api-key); never forwarded, never logged
        self.credential: bytes | None = None
        self.accept_encoding: bytes | None = None
        self.content_encoding: bytes | None = None
        self.content_length: bytes | None = None
        #: the response coding negotiated from Accept-Encoding (SPEC §9)
        self.coding = "identity"
        #: accepted edge hop times: (name, hop.index, epoch seconds it received the request)
        self.edge_times: list[tuple[str, int, float]] = []
        #: edge hop name -> why its header was discarded ("future", "stale", "invalid")
        self.edge_marks: dict[str, str] = {}
        #: the raw (traceparent, tracestate) the client sent, and the trace ids chosen for us
        self.incoming_trace: tuple[bytes, bytes | None] | None = None
        self.trace: Any = None
        #: completion text pieces, collected only with tracing.capture_content = true
        self.captured: list[str] | None = None
        self.body = b""
        self.payload: dict[str, Any] | None = None
        self.model: str | None = None
        self.stream = False
        self.operation: str | None = None
        self.route: Route | None = None
        #: what the route's policies changed (max_tokens cap, history window), for the router span
        self.policies: dict[str, Any] = {}
        self.tenant: str | None = None
        #: hit | miss | bypass | off (SPEC §7 gateway.cache)
        self.cache = "off"
        self.cache_control: bytes | None = None
        #: OpenAI-Organization / OpenAI-Project as sent (part of the cache key, SPEC §10)
        self.forwarded_org: dict[str, str] | None = None
        self.cache_lookup_start: float | None = None
        self.cache_lookup_end: float | None = None
        self.cache_store_start: float | None = None
        self.cache_store_end: float | None = None
        self.cache_stored: int | None = None
        self.cache_error = False
        self.cache_key: str | None = None
        self.attempts: list[Attempt] = []
        self.status = 0
        self.response_started = False
        self.disconnected = False
        self.error: GatewayError | None = None
        #: extra headers for the client response (x-request-id, Server-Timing, ...)
        self.response_headers: list[tuple[bytes, bytes]] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []

    # -- derived timings (ms), SPEC §6

    def upstream_time(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        return sum(a.duration(now) for a in self.attempts)

    def request_time(self) -> float:
        t = self.timeline
        return (t.done if t.done is not None else time.perf_counter()) - t.received

    def overhead(self) -> float:
        t = self.timeline
        end = t.done if t.done is not None else time.perf_counter()
        return max(0.0, (end - t.received) - self.upstream_time(end))

    def ttft(self) -> float | None:
        t = self.timeline
        return None if t.first_content is None else t.first_content - t.received
