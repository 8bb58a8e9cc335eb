"""The metrics of one process (:class:`Metrics`), recorded at each request's end from its
Timeline (a :data:`gateway.telemetry.Sink`) and snapshotted for a scrape.

A request of one attempt or of none (a cache hit), without an error, edge hops or a stateful
call, does one dict lookup for its (route, model, answered model, status, backend, cache,
tenant) and gets the label tuples and histogram rows of every series it touches
(:class:`_Plan`); any other request looks each series up (:func:`_record`; the same counts,
tested against each other).

Label values are bounded: ``route`` is a configured route name, ``model`` a route pattern or the
model the upstream answered with (at most :data:`MAX_MODELS` distinct ones, then ``other``),
``backend`` a configured backend, ``hop`` a configured edge hop or intake / auth / router /
upstream.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from gateway.budgets.spend import cost
from gateway.context import Attempt, RequestContext
from gateway.memo import remember
from gateway.telemetry.metrics.groups import (
    A2aMetrics,
    McpMetrics,
    ObjectMetrics,
    RealtimeMetrics,
    SpendMetrics,
)
from gateway.telemetry.metrics.merge import (
    GAUGES,
    histogram_family,
    merge_counters,
    merge_gauges,
)
from gateway.telemetry.metrics.series import (
    DURATION_BUCKETS,
    FINE_BUCKETS,
    Counter,
    ExemplarData,
    Histogram,
    Labels,
)
from gateway.telemetry.spans import EdgeHop

MAX_MODELS = 200
OTHER = "other"
_bisect = bisect.bisect_left
#: the hop histogram's labels of the gateway's own hops (docs/spec.md §11)
_INTAKE: Labels = ("intake",)
_AUTH: Labels = ("auth",)
_ROUTER: Labels = ("router",)
_UPSTREAM: Labels = ("upstream",)


class Metrics:
    """The docs/spec.md §11 metrics of one process; a :data:`gateway.telemetry.Sink` at request
    end."""

    def __init__(
        self,
        route_patterns: Mapping[str, tuple[str, ...]],
        gauges: Callable[[], dict[str, dict[Labels, float]]] | None = None,
    ) -> None:
        self.requests = Counter(
            "gateway_requests", "Requests answered", ("route", "model", "status_code")
        )
        self._latency_histograms()
        self.tokens = Counter("gateway_tokens", "Tokens the upstreams reported", ("model", "kind"))
        self.errors = Counter(
            "gateway_errors", "Answers that were errors", ("status_code", "error_type")
        )
        self.cache = Counter("gateway_cache_requests", "Cache outcomes", ("result",))
        #: the protocol the client spoke (docs/spec.md §27)
        self.protocols = Counter("gateway_requests_by_protocol", _PROTOCOLS_DOC, ("protocol",))
        self.spend = SpendMetrics()
        self.counters: tuple[Counter, ...] = (self.requests, self.tokens, self.errors)
        self.counters = (*self.counters, self.cache, self.protocols, *self.spend.counters)
        self.histograms: tuple[Histogram, ...] = (
            self.request_duration,
            self.upstream_duration,
        )
        self.histograms = (*self.histograms, self.overhead, self.ttft, self.hops)
        #: read by :class:`gateway.telemetry.loop_lag.LoopLag` every 100 ms, not per request
        self.loop_lag = Histogram(
            "gateway_event_loop_lag_seconds",
            "How late the event loop ran a callback due every 100 ms: time it was busy "
            "elsewhere, which socket stamps count in the interval they close",
            (),
            FINE_BUCKETS,
        )
        self.histograms = (*self.histograms, self.loop_lag)
        self.use_routes(route_patterns)
        self._models: set[str] = set()
        #: (route, model, answered model, status, backend, cache, cache error, tenant, HTTP
        #: version) -> rows
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._gauges = gauges
        #: requests in flight (their route is read at scrape time: it may not be known yet)
        self.inflight: dict[int, RequestContext] = {}
        #: realtime sessions (docs/spec.md §19): their counter and histogram scrape as the others
        self.realtime = RealtimeMetrics()
        self.counters = (*self.counters, self.realtime.sessions)
        self.histograms = (*self.histograms, self.realtime.message_overhead)
        #: MCP requests (docs/spec.md §23), counted by gateway/mcp as each one ends
        self.mcp = McpMetrics()
        self.counters = (*self.counters, self.mcp.requests)
        self.histograms = (*self.histograms, self.mcp.duration)
        #: A2A calls (docs/spec.md §30), counted by gateway/a2a as each one ends
        self.a2a = A2aMetrics()
        self.counters = (*self.counters, self.a2a.requests)
        self.histograms = (*self.histograms, self.a2a.duration)
        #: stateful calls (docs/spec.md §24)
        self.objects = ObjectMetrics()
        self.counters = (*self.counters, self.objects.bytes)
        self.histograms = (*self.histograms, self.objects.duration)
        self._reload_counter()

    def _reload_counter(self) -> None:
        #: config reloads (docs/spec.md §29), per process: result "ok" or "error"
        self.reloads = Counter("gateway_config_reloads", "Config reloads", ("result",))
        self.reloads.values.update({("ok",): 0.0, ("error",): 0.0})  # scraped from the start
        self.counters = (*self.counters, self.reloads)

    def use_routes(self, route_patterns: Mapping[str, tuple[str, ...]]) -> None:
        """The routes (of the config, and of each reload): the labels they give."""
        #: route name -> its literal (glob-free) model patterns
        self._literal = {
            name: frozenset(p for p in patterns if not set(p) & set("*?["))
            for name, patterns in route_patterns.items()
        }
        self._patterns = route_patterns
        self._plans = {}

    def _latency_histograms(self) -> None:
        self.request_duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from the first request byte to the last response byte",
            ("route", "model"),
            DURATION_BUCKETS,
        )
        self.upstream_duration = Histogram(
            "gateway_upstream_duration_seconds",
            "Time of each upstream attempt",
            ("backend", "model"),
            DURATION_BUCKETS,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Request time minus upstream time (nginx's $request_time - $upstream_response_time)",
            ("route",),
            FINE_BUCKETS,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from the first request byte to the first content event sent (streams)",
            ("model",),
            DURATION_BUCKETS,
        )
        self.hops = Histogram(
            "gateway_hop_duration_seconds",
            "Time spent in each hop: edge hops, intake, auth, router, upstream",
            ("hop",),
            FINE_BUCKETS,
        )

    # ------------------------------------------------------------ per request

    def begin(self, ctx: RequestContext) -> None:
        self.inflight[id(ctx)] = ctx

    def __call__(self, ctx: RequestContext, edges: list[EdgeHop]) -> None:
        """Record one finished request (the Telemetry sink)."""
        self.inflight.pop(id(ctx), None)
        call = ctx.call
        answer = ctx.answer
        attempts = ctx.attempts
        if (
            call is None
            or len(attempts) > 1
            or edges
            or answer.error is not None
            or ctx.object_call is not None
        ):
            _record(self, ctx, edges)
            return
        cache = ctx.cache
        key = (
            call.route.name,
            ctx.model,
            answer.response_model,
            answer.status,
            attempts[0].backend.name if attempts else None,  # None: no attempt (a cache hit)
            cache.result,
            cache.error,
            ctx.tenant,
            ctx.scope.get("http_version"),
        )
        plan = self._plans.get(key) or self._plan(ctx, key)
        plan.record(self, ctx)

    def _plan(self, ctx: RequestContext, key: tuple[Any, ...]) -> _Plan:
        route, _model, _answered, status, backend, result, error, tenant, version = key
        plan = _Plan(self, route, self.model_label(ctx), str(status), backend, tenant or "-")
        plan.protocol = (protocol_label(version),)
        plan.error = None if (kind := ctx.answer.error_type()) is None else (plan.status, kind)
        plan.cache = None if result == "off" else (result,)
        plan.cache_error = bool(error)
        return remember(self._plans, key, plan, 4096)

    def count_tokens(
        self,
        model: str,
        input_: int | None,
        output: int | None,
        cached_input: int | None = None,
        cache_write: int | None = None,
        reasoning: int | None = None,
    ) -> None:
        """``gateway_tokens_total`` by kind, for a request's usage or a realtime response's."""
        tokens = self.tokens
        if input_:
            tokens.inc((model, "input"), input_)
        if output:
            tokens.inc((model, "output"), output)
        if cached_input:
            tokens.inc((model, "cached_input"), cached_input)
        if cache_write:
            tokens.inc((model, "cache_write"), cache_write)
        if reasoning:
            tokens.inc((model, "reasoning"), reasoning)

    def _spend(self, ctx: RequestContext, route: str, model: str) -> None:
        """Tokens by kind and the cost, from the one usage record (docs/spec.md §20)."""
        usage = ctx.answer.tokens
        self.count_tokens(
            model, usage.input, usage.output, usage.cached_input, usage.cache_write, usage.reasoning
        )
        if ctx.call is None:  # not a model call: only a batch's results are priced (§24)
            usd = ctx.answer.cost_usd
            if usd and ctx.object_call is not None:
                self.spend.cost.inc((ctx.object_call[0], model, ctx.tenant or "-"), usd)
            return
        usd = cost(ctx)
        if usd is not None:
            self.spend.cost.inc((route, model, ctx.tenant or "-"), usd)
        elif ctx.attempts:  # an upstream answered a model nobody priced
            self.spend.unpriced.inc((model,))

    def model_label(self, ctx: RequestContext) -> str:
        """A bounded ``model`` label: never an arbitrary client string (docs/spec.md §11)."""
        call = ctx.call
        if call is None or ctx.model is None:
            return OTHER
        if ctx.model in self._literal.get(call.route.name, ()):
            return ctx.model
        answered = ctx.answer.response_model
        if answered is not None and (answered in self._models or len(self._models) < MAX_MODELS):
            self._models.add(answered)
            return answered
        # the route pattern that matched (bounded by the config)
        model = ctx.model
        return next(
            (p for p in self._patterns.get(call.route.name, ()) if fnmatch.fnmatchcase(model, p)),
            OTHER,
        )

    # ------------------------------------------------------------ scrape

    def snapshot(self) -> dict[str, Any]:
        """This process's aggregates as plain data (JSON-able; merged across workers)."""
        inflight: dict[str, float] = dict.fromkeys(self._patterns, 0.0)  # every route, 0 too
        for ctx in list(self.inflight.values()):
            route = ctx.call.route.name if ctx.call is not None else "none"
            inflight[route] = inflight.get(route, 0.0) + 1
        gauges: dict[str, list[list[Any]]] = {
            "gateway_inflight_requests": [[[r], v] for r, v in inflight.items()]
        }
        for name, series in (self._gauges() if self._gauges else {}).items():
            gauges[name] = [[list(labels), v] for labels, v in series.items()]
        gauges["gateway_realtime_sessions"] = [[[], float(self.realtime.open)]]
        return {
            "pid": os.getpid(),
            "counters": {
                c.name: [[list(k), v] for k, v in c.values.items()] for c in self.counters
            },
            "histograms": {
                h.name: [
                    [list(k), row, [[i, *ex] for i, ex in h.exemplars.get(k, {}).items()]]
                    for k, row in h.series.items()
                ]
                for h in self.histograms
            },
            "gauges": gauges,
        }

    def families(self, snapshots: list[dict[str, Any]]) -> Iterator[Metric]:
        """prometheus-client metric families of the merged snapshots."""
        return _families(self, snapshots)


def _families(m: Metrics, snapshots: list[dict[str, Any]]) -> Iterator[Metric]:
    for c in m.counters:
        family = UnknownMetricFamily if c.untyped else CounterMetricFamily
        fam = family(c.name, c.doc, labels=c.labelnames)
        for labels, value in merge_counters(snapshots, c.name).items():
            fam.add_metric(labels, value)
        yield fam
    for h in m.histograms:
        yield histogram_family(h, snapshots)
    for name, (doc, labelnames, combine) in GAUGES.items():
        gauge = GaugeMetricFamily(name, doc, labels=labelnames)
        for labels, value in merge_gauges(snapshots, name, combine).items():
            gauge.add_metric(labels, value)
        yield gauge


def _record(m: Metrics, ctx: RequestContext, edges: list[EdgeHop]) -> None:
    """Record any request (:meth:`Metrics.__call__`): what :class:`_Plan` does for the common
    one, with every label tuple and row looked up."""
    t = ctx.timeline
    answer = ctx.answer
    call = ctx.call
    route = call.route.name if call is not None else "none"
    model = m.model_label(ctx)
    status = str(answer.status)
    done = t.done if t.done is not None else t.received
    request_s = done - t.received
    attempts = ctx.attempts
    # ctx.upstream_time(done), without its generator for the usual one attempt
    upstream_s = _one_attempt(attempts[0], done) if len(attempts) == 1 else ctx.upstream_time(done)
    trace_id, now = _exemplar(ctx)
    m.requests.inc((route, model, status))
    m.protocols.inc((protocol_label(ctx.scope.get("http_version")),))
    m.request_duration.observe((route, model), request_s, trace_id, now)
    overhead_s = max(0.0, request_s - upstream_s - t.backoff)  # waits are not overhead
    m.overhead.observe((route,), overhead_s, trace_id, now)
    for attempt in attempts:
        backend = (attempt.backend.name, model)
        m.upstream_duration.observe(backend, attempt.duration(done), trace_id, now)
    if t.first_content is not None:
        m.ttft.observe((model,), t.first_content - t.received, trace_id, now)
    _observe_hops(m.hops, ctx, edges, upstream_s)
    if ctx.object_call is not None:
        m.objects.observe(ctx, request_s, trace_id)
    m._spend(ctx, route, model)
    kind = answer.error_type()
    if kind is not None:
        m.errors.inc((status, kind))
    outcome = ctx.cache
    if outcome.result != "off":
        m.cache.inc((outcome.result,))
    if outcome.error:
        m.cache.inc(("error",))


class _Plan:
    """The rows and label tuples of one (route, model, status, backend, cache, tenant): a
    request of one attempt, or of none (a cache hit: backend None), does one dict lookup for
    them all, then direct increments (the rows are made here, as :meth:`Histogram.observe`
    would make them; no upstream row without an attempt)."""

    __slots__ = (
        "cache",
        "cache_error",
        "cost",
        "duration",
        "error",
        "input",
        "model",
        "output",
        "overhead",
        "protocol",
        "request",
        "status",
        "unpriced",
        "upstream",
    )

    def __init__(
        self, m: Metrics, route: str, model: str, status: str, backend: str | None, tenant: str
    ) -> None:
        self.model = (model,)
        self.status = status
        self.request = (route, model, status)
        self.duration = _row(m.request_duration, (route, model))
        self.overhead = _row(m.overhead, (route,))
        self.upstream = None if backend is None else _row(m.upstream_duration, (backend, model))
        self.input = (model, "input")
        self.output = (model, "output")
        self.cost = (route, model, tenant)
        self.unpriced = (model,)
        self.error: tuple[str, str] | None = None
        self.cache: tuple[str] | None = None
        self.cache_error = False
        self.protocol = ("HTTP/1.1",)

    def record(self, m: Metrics, ctx: RequestContext) -> None:
        """:meth:`Metrics._record` of a request of one attempt or none, without error or edge
        hops."""
        t = ctx.timeline
        done = t.done if t.done is not None else t.received
        request_s = done - t.received
        attempts = ctx.attempts
        upstream_s = _one_attempt(attempts[0], done) if attempts else 0.0
        trace_id, now = _exemplar(ctx)
        _inc(m.requests.values, self.request, 1.0)
        _inc(m.protocols.values, self.protocol, 1.0)
        _put(self.duration, request_s, trace_id, now)
        _put(self.overhead, max(0.0, request_s - upstream_s - t.backoff), trace_id, now)
        if self.upstream is not None:
            _put(self.upstream, upstream_s, trace_id, now)
        if t.first_content is not None:
            m.ttft.observe(self.model, t.first_content - t.received, trace_id, now)
        _observe_hops(m.hops, ctx, [], upstream_s)
        usage = ctx.answer.tokens
        tokens = m.tokens.values
        if usage.input:
            _inc(tokens, self.input, usage.input)
        if usage.output:
            _inc(tokens, self.output, usage.output)
        if usage.cached_input or usage.cache_write or usage.reasoning:
            m.count_tokens(
                self.model[0], None, None, usage.cached_input, usage.cache_write, usage.reasoning
            )
        usd = cost(ctx)
        if usd is not None:
            _inc(m.spend.cost.values, self.cost, usd)
        elif attempts:  # an upstream answered a model nobody priced
            _inc(m.spend.unpriced.values, self.unpriced, 1.0)
        if self.error is not None:
            _inc(m.errors.values, self.error, 1.0)
        if self.cache is not None:
            _inc(m.cache.values, self.cache, 1.0)
        if self.cache_error:
            _inc(m.cache.values, ("error",), 1.0)


_PROTOCOLS = {"1.1": "HTTP/1.1", "2": "HTTP/2", "1.0": "HTTP/1.0"}
_PROTOCOLS_DOC = "Requests answered, by the protocol the client spoke (HTTP/1.1, HTTP/2)"


def protocol_label(http_version: object) -> str:
    """The ``protocol`` label of an ASGI ``http_version`` (bounded: anything else is
    ``other``).

    >>> protocol_label("2"), protocol_label(None), protocol_label("9")
    ('HTTP/2', 'HTTP/1.1', 'other')
    """
    if http_version is None:
        return "HTTP/1.1"
    return _PROTOCOLS.get(str(http_version), "other")


#: a histogram's row of one label tuple, its exemplars and bucket bounds
_Row = tuple[list[float], dict[int, ExemplarData], tuple[float, ...]]


def _exemplar(ctx: RequestContext) -> tuple[int | None, float]:
    """The exemplars' trace id (a sampled trace's, else None) and timestamp, read once."""
    trace = ctx.trace
    if trace is not None and trace.sampled:
        return trace.trace_id, time.time()
    return None, 0.0


def _one_attempt(a: Attempt, done: float) -> float:
    """The upstream time of a request's only attempt (``ctx.upstream_time(done)``)."""
    return (a.end if a.end is not None else done) - a.start


def _row(h: Histogram, labels: Labels) -> _Row:
    row = h.series.get(labels)
    if row is None:
        row = h.series[labels] = [0.0] * (len(h.bounds) + 2)
    exemplars = h.exemplars.get(labels)
    if exemplars is None:
        exemplars = h.exemplars[labels] = {}
    return row, exemplars, h.bounds


def _put(row: _Row, value: float, trace_id: int | None, now: float) -> None:
    """:meth:`Histogram.observe` on a row already looked up."""
    counts, exemplars, bounds = row
    i = _bisect(bounds, value)
    counts[i] += 1
    counts[-1] += value
    if trace_id is not None:
        exemplars[i] = (trace_id, value, now)


def _inc(values: dict[Labels, float], labels: Labels, amount: float) -> None:
    values[labels] = values.get(labels, 0.0) + amount


def _observe_hops(
    hops: Histogram, ctx: RequestContext, edges: list[EdgeHop], upstream_s: float
) -> None:
    """``gateway_hop_duration_seconds`` of a request: edge hops, intake, auth, router, upstream."""
    for name, _index, start, end in edges:
        hops.observe((name,), end - start)
    t = ctx.timeline
    intake = (_INTAKE, t.intake_done - t.received)
    auth_done = t.auth_done
    if auth_done is None:
        hops.observe_each((intake, (_UPSTREAM, upstream_s)) if ctx.attempts else (intake,))
        return
    auth = (_AUTH, auth_done - t.intake_done)
    routed = t.routed
    if routed is None:
        pairs: tuple[tuple[Labels, float], ...] = (intake, auth)
    else:
        pairs = (intake, auth, (_ROUTER, routed - auth_done))
    hops.observe_each((*pairs, (_UPSTREAM, upstream_s)) if ctx.attempts else pairs)


__all__ = ["MAX_MODELS", "OTHER", "Metrics"]
