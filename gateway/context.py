"""The per-request context and its Timeline: the single source of every timing (docs/spec.md §6).

Hops fill the context in order (edge → auth → router → upstream → response) and never
reach back; spans, ``Server-Timing``, metrics and the access log are all derived from the
Timeline points below, so they cannot disagree.

Points (Envoy's names in brackets), ``time.perf_counter()`` seconds, ``None`` until reached::

    received            [DS_RX_BEG]  the request's first byte read from the client socket
    intake_done                      the request handed to the application (HTTP parsing and
                                     dispatch by the gateway's own server: the ``intake`` hop)
    body_received                    request body fully read
    auth_done                        key checked, tenant known
    routed                           body parsed, route chosen, cache looked up
    upstream_sent       [US_TX_BEG]  right before the request's last write to the upstream socket
    client_first_byte   [DS_TX_BEG]  response headers handed to the client transport
    first_content                    first content-bearing SSE event sent (TTFT)
    done                [DS_TX_END]  the last byte handed to the client transport

The points sit at the sockets (docs/architecture.md, "The Timeline"): ``received`` is stamped by the
server protocol (:class:`gateway.server.http1.Http1Protocol`) under :data:`RECEIVED_AT` in
the ASGI scope, before any parsing or queueing; the upstream points by the transport, at its
socket (an attempt's ``start`` is when its connection was being opened, or on a pooled one
when the request's last byte was written; its ``end`` when the answer's last byte was read). So
``upstream_time`` is the upstream's (and the network's) time, not the client library's, and
everything else between ``received`` and ``done`` is the gateway's overhead.

The context is typed in parts, each written by one hop: the edge's facts on the context itself,
:class:`Call` (the router), :class:`CacheOutcome` (the cache), :class:`Answer` (the upstream
and the response writer) and :class:`TraceContext` (the trace ids, fixed at the edge).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

#: the ASGI scope key under which the server puts ``time.perf_counter()`` of the moment the
#: request's first byte was read from the client socket (absent: the first ASGI event is used)
RECEIVED_AT = "gateway.received_at"
#: a key of an ``http.response.start`` message: True when the app sends the body in the same
#: step (a whole answer), so the server holds the head for it without a flush of its own
BODY_FOLLOWS = "gateway.body_follows"

if TYPE_CHECKING:
    from gateway.errors import GatewayError
    from gateway.routes import Backend, Route
    from gateway.types import Scope


class Timeline:
    # unreached points are None (class defaults: a Timeline is made per request)
    body_received: float | None = None
    auth_done: float | None = None
    routed: float | None = None
    upstream_sent: float | None = None
    client_first_byte: float | None = None
    first_content: float | None = None
    last_event: float | None = None
    done: float | None = None
    #: seconds between consecutive SSE events relayed to the client (streams only)
    event_gaps: list[float] | None = None
    #: seconds waited between upstream attempts (retry backoff, an honoured Retry-After):
    #: neither the upstream's time nor the gateway's own (docs/spec.md §6)
    backoff: float = 0.0
    #: the event loop's largest lag while the request ran, in seconds (read at its end; None:
    #: not measured): time the loop was busy elsewhere, which the socket stamps count in the
    #: interval they close (docs/architecture.md, "The Timeline")
    loop_lag: float | None = None

    def __init__(self) -> None:
        self.wall_ns = time.time_ns()
        #: until the server's socket stamp moves ``received`` back, intake takes no time
        self.received = self.intake_done = time.perf_counter()

    def received_at(self, t: float) -> None:
        """Move ``received`` back to ``t`` (the socket read), the wall clock with it."""
        if t < self.received:
            self.wall_ns -= int((self.received - t) * 1e9)
            self.received = t

    def epoch_ns(self, t: float) -> int:
        """A perf_counter point as Unix epoch nanoseconds (for span timestamps)."""
        return self.wall_ns + int((t - self.received) * 1e9)


class Attempt:
    """One try of one backend; ``upstream_time`` sums them all (docs/spec.md §6)."""

    __slots__ = (
        "affinity",
        "backend",
        "end",
        "error",
        "first_byte",
        "load",
        "number",
        "span_id",
        "start",
        "status",
    )

    def __init__(self, backend: Backend, number: int, span_id: int) -> None:
        self.backend = backend
        self.number = number
        self.span_id = span_id
        self.start = time.perf_counter()
        self.first_byte: float | None = None
        self.end: float | None = None
        self.status: int | None = None
        self.error: GatewayError | None = None
        #: on a route with affinity: "hit" (the key's preferred backend), "spill" or "none"
        #: (no key); None elsewhere (docs/spec.md §21)
        self.affinity: str | None = None
        #: the backend's (queue depth, KV-cache usage) as last scraped when it was chosen
        self.load: tuple[float, float | None] | None = None

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start

    def finished(self, at: float | None = None) -> None:
        """The attempt is over: at ``at`` (the answer's last byte read, from the transport's
        socket clock) or now."""
        if self.end is None:
            self.end = time.perf_counter() if at is None else at

    def at_sockets(self, start: float | None, first_byte: float | None) -> None:
        """Take the transport's socket times over the hop's (docs/spec.md §6): ``start`` when the
        connection was being opened or the request's last byte was written, ``first_byte`` when
        the answer's first byte was read. Whatever ran between those and the hop's own stamps
        (building the request, the client library, waiting for the event loop) is overhead."""
        if start is not None and start >= self.start:
            self.start = start
        if first_byte is not None and first_byte >= self.start:
            self.first_byte = first_byte


class TraceContext:
    """The ids of one request's trace, fixed when the request arrives (docs/spec.md §7)."""

    __slots__ = (
        "flags",
        "id_bytes",
        "parent_span_id",
        "prefix",
        "root_span_id",
        "sampled",
        "suffix",
        "trace_id",
        "trace_state",
    )

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
        #: the trace id's 16 bytes, ``00-<trace id hex>-`` and ``-<flags>``, made once: a
        #: traceparent is then the span id's hex between them (``.hex()`` is the fast format)
        self.id_bytes = trace_id.to_bytes(16, "big")
        self.prefix = "00-" + self.id_bytes.hex() + "-"
        self.suffix = "-01" if sampled else "-00"

    def traceparent(self, span_id: int) -> str:
        return self.prefix + span_id.to_bytes(8, "big").hex() + self.suffix


CacheResult = Literal["off", "hit", "miss", "bypass"]


class CacheOutcome:
    """What the cache did for this request (docs/spec.md §10): ``x-gateway-cache`` and its spans."""

    __slots__ = (
        "error",
        "key",
        "lookup_end",
        "lookup_start",
        "result",
        "store_end",
        "store_start",
        "stored",
    )

    def __init__(self) -> None:
        self.result: CacheResult = "off"
        self.key: str | None = None
        self.lookup_start: float | None = None
        self.lookup_end: float | None = None
        self.store_start: float | None = None
        self.store_end: float | None = None
        #: bytes written to the store
        self.stored: int | None = None
        #: the store could not answer (Redis down, breaker open)
        self.error = False


class Call:
    """A model call as the router established it: the parsed body, the route, the policies."""

    __slots__ = ("body", "operation", "path", "payload", "policies", "route", "stream")

    def __init__(
        self,
        path: str,
        operation: str,
        body: bytes,
        payload: dict[str, Any],
        stream: bool,
        route: Route,
    ) -> None:
        self.path = path
        #: gen_ai.operation.name: chat | text_completion | embeddings | ...
        self.operation = operation
        #: what goes upstream: the client's bytes, re-serialised only when a policy changed them
        self.body = body
        self.payload = payload
        self.stream = stream
        self.route = route
        #: what the route's policies changed (max_tokens cap, history window), for the router span
        self.policies: Mapping[str, Any] = _NO_POLICIES

    def wants_usage(self) -> bool:
        opts = self.payload.get("stream_options")
        return isinstance(opts, dict) and opts.get("include_usage") is True


_NO_POLICIES: Mapping[str, Any] = MappingProxyType({})


class LiveSession(Protocol):
    """An open realtime session as the live view sees it (docs/spec.md §19):
    :class:`gateway.realtime.session.Realtime` registers one per accepted session in
    ``Runtime.sessions``; :meth:`view` is called only when somebody looks."""

    def view(self) -> dict[str, Any]: ...


class CallerKey(Protocol):
    """The caller's API key entry as the parts after the auth hop read it
    (:class:`gateway.hops.auth.KeyEntry`; the key itself is never kept, only its digest)."""

    #: the sha256 of the key
    digest: bytes
    tenant: str
    #: ``admin = true``: may open the live view, reach every passthrough path
    admin: bool
    #: a budget of its own or of its tenant's: what it calls must have a price
    budgeted: bool
    #: its model calls reserve before going upstream (tpm, budgets): the auth hop's admit step
    metered: bool

    def permits(self, model: str) -> bool:
        """Whether its ``models`` globs allow ``model``."""
        ...


class Pricing(Protocol):
    """What prices a finished request (:class:`gateway.budgets.spend.Prices`)."""

    def cost(self, ctx: RequestContext) -> float | None: ...


class Usage:
    """The tokens of one answer as its upstream reported them (docs/spec.md §20): read once per
    protocol (:mod:`gateway.protocols`, JSON answers and stream events alike); tokens, cost, tpm,
    budgets, metrics, spans and the access log all take them from here.

    ``input`` is all input, its cached part (``cached_input``, served from the provider's prompt
    cache) and its cache writes (``cache_write``, Anthropic's ``cache_creation_input_tokens``)
    included; ``output`` all output, ``reasoning`` included. ``input``/``output`` are None until
    reported; the parts are 0 unless reported.
    """

    __slots__ = ("cache_write", "cached_input", "input", "output", "reasoning")

    def __init__(self) -> None:
        self.input: int | None = None
        self.output: int | None = None
        self.cached_input = 0
        self.cache_write = 0
        self.reasoning = 0

    @property
    def reported(self) -> bool:
        """Whether the upstream reported any usage at all."""
        return self.input is not None or self.output is not None

    @property
    def total(self) -> int:
        """Input + output (what ``tpm`` counts)."""
        return (self.input or 0) + (self.output or 0)

    def parts(self, cached_input: Any, cache_write: Any, reasoning: Any) -> None:
        """Record the parts a protocol reports (values that are not ints are ignored)."""
        if type(cached_input) is int:
            self.cached_input = cached_input
        if type(cache_write) is int:
            self.cache_write = cache_write
        if type(reasoning) is int:
            self.reasoning = reasoning


class Answer:
    """What came back: status (set by the response writer), usage, cost, ids, the error if any."""

    __slots__ = (
        "admission_due",
        "captured",
        "cost_usd",
        "costed",
        "error",
        "finish_reasons",
        "pricing",
        "reservation",
        "reserved_nano",
        "reserved_tokens",
        "response_id",
        "response_model",
        "status",
        "tokens",
    )

    def __init__(self) -> None:
        self.status = 0
        self.error: GatewayError | None = None
        #: the usage the upstream reported (docs/spec.md §20)
        self.tokens = Usage()
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] | None = None
        #: completion text pieces, collected only with tracing.capture_content = true
        self.captured: list[str] | None = None
        #: how this request's usage is priced (:class:`gateway.budgets.spend.Prices`, named by
        #: the auth hop); None: it is not priced at all
        self.pricing: Pricing | None = None
        #: the cost in USD, worked out once when first asked (:func:`gateway.budgets.spend.cost`;
        #: None: no price for the model, or not a model call)
        self.cost_usd: float | None = None
        self.costed = False
        #: what the auth hop reserved before the upstream call (tpm tokens, budget nano-USD),
        #: replaced by the real usage at the end
        self.reserved_tokens = 0
        self.reserved_nano = 0
        #: the model call's limits are still to be checked (and its worst case reserved) by the
        #: auth hop's admit step, once the body is parsed: set when the key is identified
        self.admission_due = False
        #: the reservation's id (gateway/budgets/reservations.py; '' when nothing was reserved)
        self.reservation = ""

    @property
    def input_tokens(self) -> int | None:
        """All input tokens (``gen_ai.usage.input_tokens``): :attr:`Usage.input`."""
        return self.tokens.input

    @input_tokens.setter
    def input_tokens(self, value: int | None) -> None:
        self.tokens.input = value

    @property
    def output_tokens(self) -> int | None:
        """All output tokens (``gen_ai.usage.output_tokens``): :attr:`Usage.output`."""
        return self.tokens.output

    @output_tokens.setter
    def output_tokens(self, value: int | None) -> None:
        self.tokens.output = value

    def error_type(self) -> str | None:
        """What went wrong, for metrics and logs: the gateway error's code, or the kind of an
        upstream error answer passed through, or a client that went away (None: no error)."""
        error = self.error
        if error is not None:
            return error.code or error.type
        if self.status == 499:
            return "client_disconnected"
        if self.status >= 500:
            return "upstream_server_error"
        if self.status >= 400:
            return "upstream_client_error"
        return None

    def usage(self, input_tokens: Any, output_tokens: Any) -> None:
        """Record input and output tokens (values that are not ints are ignored)."""
        tokens = self.tokens
        if type(input_tokens) is int:
            tokens.input = input_tokens
        if type(output_tokens) is int:
            tokens.output = output_tokens


class RequestContext:
    """What the hops establish about one request; data moves forward only.

    Defaults live on the class (all immutable) and ``__init__`` sets only what every request
    has: a request creates one of these, so its construction is on the hot path.
    """

    # -- from the edge
    request_id = ""
    peer_trusted = False
    #: the client's API key (Bearer, api-key or x-api-key); never forwarded, never logged
    credential: bytes | None = None
    accept_encoding: bytes | None = None
    content_encoding: bytes | None = None
    content_length: bytes | None = None
    cache_control: bytes | None = None
    #: OpenAI-Organization / OpenAI-Project as sent (part of the cache key, docs/spec.md §10)
    forwarded_org: dict[str, str] | None = None
    #: accepted edge hop times: (name, hop.index, epoch seconds it received the request)
    edge_times: Sequence[tuple[str, int, float]] = ()
    #: edge hop name -> why its header was discarded ("future", "stale", "invalid", ...)
    edge_marks: Mapping[str, str] = MappingProxyType({})
    #: the raw (traceparent, tracestate) the client sent
    incoming_trace: tuple[bytes, bytes | None] | None = None
    #: the trace ids chosen for this request (None when tracing is off)
    trace: TraceContext | None = None
    # -- from auth
    tenant: str | None = None
    #: the caller's key has ``admin = true`` (may open the live view when auth is on)
    admin = False
    #: the models the caller's key may call (None: every model); the router asks it
    permits: Callable[[str], bool] | None = None
    #: the caller's key entry (None: auth off), whose limits and budgets the request counts
    #: against
    limit_key: CallerKey | None = None
    # -- from the router
    #: the response coding negotiated from Accept-Encoding (docs/spec.md §9)
    coding = "identity"
    #: the model the body asked for (known even when no route serves it)
    model: str | None = None
    call: Call | None = None
    #: the client went away before the answer was complete (status 499)
    disconnected = False
    #: a stateful call's streamed upload and download, in bytes (docs/spec.md §24; None: the
    #: request streamed none): the root span's http.request.body.size / http.response.body.size
    upload_bytes: int | None = None
    download_bytes: int | None = None
    #: a stateful call's (route, operation) (docs/spec.md §24): gateway_object_* metrics
    object_call: tuple[str, str] | None = None
    #: a realtime session's own facts, set at its end for the live view (messages each way,
    #: close code, responses with TTFT: :meth:`gateway.realtime.session.Realtime` writes it)
    realtime: Mapping[str, Any] | None = None
    #: an MCP request's facts (server, JSON-RPC method, tool, session, status; docs/spec.md
    #: §23), written by :mod:`gateway.mcp` for its spans, access-log line and the live view
    mcp: dict[str, Any] | None = None
    #: an A2A call's facts (agent, method, task, context, state, status; docs/spec.md §30),
    #: written by :mod:`gateway.a2a` for its spans, access-log line and the live view
    a2a: dict[str, Any] | None = None

    def __init__(self, scope: Scope, timeline: Timeline) -> None:
        self.scope = scope
        received = scope.get(RECEIVED_AT)
        if received is not None:  # the socket read, stamped by the server protocol
            timeline.received_at(received)
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
        #: extra headers for the client response (x-request-id, x-gateway-cache, ...)
        self.response_headers: list[tuple[bytes, bytes]] = []
        self.cache = CacheOutcome()
        self.answer = Answer()

    # -- derived timings (s), docs/spec.md §6

    def upstream_time(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        return sum(a.duration(now) for a in self.attempts)

    def request_time(self) -> float:
        t = self.timeline
        return (t.done if t.done is not None else time.perf_counter()) - t.received

    def overhead(self) -> float:
        t = self.timeline
        end = t.done if t.done is not None else time.perf_counter()
        return max(0.0, (end - t.received) - self.upstream_time(end) - t.backoff)

    def ttft(self) -> float | None:
        t = self.timeline
        return None if t.first_content is None else t.first_content - t.received
