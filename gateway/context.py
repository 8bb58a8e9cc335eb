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
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.errors import GatewayError
    from gateway.hops.router import Route
    from gateway.hops.upstream import Backend
    from gateway.types import Scope


class Timeline:
    # unreached points are None (class defaults: a Timeline is made per request)
    body_received: float | None = None
    auth_done: float | None = None
    routed: float | None = None
    upstream_sent: float | None = None
    upstream_first_byte: float | None = None
    upstream_done: float | None = None
    client_first_byte: float | None = None
    first_content: float | None = None
    last_event: float | None = None
    done: float | None = None
    #: seconds between consecutive SSE events relayed to the client (streams only)
    event_gaps: list[float] | None = None

    def __init__(self) -> None:
        self.wall_ns = time.time_ns()
        self.received = time.perf_counter()

    def epoch_ns(self, t: float) -> int:
        """A perf_counter point as Unix epoch nanoseconds (for span timestamps)."""
        return self.wall_ns + int((t - self.received) * 1e9)


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
    """What the hops establish about one request; data moves forward only.

    Defaults live on the class (all immutable) and ``__init__`` sets only what every request
    has: a request creates one of these, so its construction is on the hot path.
    """

    # -- from the edge
    request_id = ""
    peer_trusted = False
    #: the client's API key (Authorization bearer or api-key); never forwarded, never logged
    credential: bytes | None = None
    accept_encoding: bytes | None = None
    content_encoding: bytes | None = None
    content_length: bytes | None = None
    cache_control: bytes | None = None
    #: OpenAI-Organization / OpenAI-Project as sent (part of the cache key, SPEC §10)
    forwarded_org: dict[str, str] | None = None
    #: accepted edge hop times: (name, hop.index, epoch seconds it received the request)
    edge_times: Sequence[tuple[str, int, float]] = ()
    #: edge hop name -> why its header was discarded ("future", "stale", "invalid", ...)
    edge_marks: Mapping[str, str] = MappingProxyType({})
    #: the raw (traceparent, tracestate) the client sent, and the trace ids chosen for us
    incoming_trace: tuple[bytes, bytes | None] | None = None
    trace: Any = None
    #: completion text pieces, collected only with tracing.capture_content = true
    captured: list[str] | None = None
    # -- from auth and the router
    tenant: str | None = None
    #: the response coding negotiated from Accept-Encoding (SPEC §9)
    coding = "identity"
    body = b""
    payload: dict[str, Any] | None = None
    model: str | None = None
    stream = False
    operation: str | None = None
    route: Route | None = None
    #: what the route's policies changed (max_tokens cap, history window), for the router span
    policies: Mapping[str, Any] = MappingProxyType({})
    # -- cache (SPEC §10): hit | miss | bypass | off
    cache = "off"
    cache_key: str | None = None
    cache_lookup_start: float | None = None
    cache_lookup_end: float | None = None
    cache_store_start: float | None = None
    cache_store_end: float | None = None
    cache_stored: int | None = None
    cache_error = False
    # -- the answer
    status = 0
    response_started = False
    disconnected = False
    error: GatewayError | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: list[str] | None = None

    def __init__(self, scope: Scope, timeline: Timeline) -> None:
        self.scope = scope
        self.timeline = timeline
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.query: bytes = scope.get("query_string", b"")
        client = scope.get("client")
        self.peer: str = client[0] if client else ""
        self.client_address: str = self.peer
        #: headers to send upstream (hygiene applied), as str pairs for the client libraries
        self.upstream_headers: list[tuple[str, str]] = []
        self.attempts: list[Attempt] = []
        #: extra headers for the client response (x-request-id, Server-Timing, ...)
        self.response_headers: list[tuple[bytes, bytes]] = []

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
