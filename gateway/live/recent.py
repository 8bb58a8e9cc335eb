"""The live view's ring buffer (docs/spec.md §18): the most recent requests, formatted on read.

:class:`RecentRequests` is a :data:`gateway.telemetry.Sink`. Per finished request it takes one
flat tuple of the Timeline's numbers (:func:`snapshot`) and appends it to a bounded deque: no
dict, no JSON, no string formatting, and nothing that keeps the request's body or headers alive
(a 10 MiB prompt is not held 500 times over). Records are built from those tuples only when
somebody reads them (:meth:`RecentRequests.records`) or watches the live feed
(:meth:`RecentRequests.watch`: each watcher has a bounded queue; a watcher that falls behind is
dropped, the request path never waits for one).

The waterfall of a record (``hops``) tiles the request: its segments follow each other without
gap or overlap from the first edge hop's start (or ``received``) to ``done``, so their durations
add up to ``edge_ms + request_ms`` (``total_ms``) and the gateway's own segments to
``request_ms``. Segments, in order (docs/spec.md §6 points, the same intervals as the spans)::

    <edge hop>...  header time of hop i -> hop i+1 (the last ends at received)   "hop cdn", ...
    intake         received      -> intake_done (the server's parsing, dispatch) "hop intake"
    auth           intake_done   -> auth_done                                    "hop auth"
    router         auth_done     -> routed (body read, parse, route, cache lookup) "hop router"
    gateway        routed        -> first attempt's start (preparing the attempt)
    upstream       attempt start -> attempt end, one per attempt               CLIENT spans
    gateway        attempt end   -> the wait before the next one (settling, deciding)
    backoff        the wait      -> next attempt's start (retry backoff, Retry-After)
    relay          last attempt's end -> done (the rest of the answer to the client)
    replay         routed -> done when the answer came from the cache (or a shared flight)

A request that waited between attempts (``Timeline.backoff``, docs/spec.md §6) draws its wait
at the end of each gap between two attempts (the wait comes right before the next attempt);
the Timeline keeps the total only, so when it waited more than once the total is shared among
the gaps in proportion to their length. ``overhead_ms`` is ``request_ms - upstream_ms -
backoff_ms``: a wait is neither the upstream's time nor the gateway's own.

``details`` are drawn inside those segments and not counted in the sum: ``cache lookup`` (inside
router) and ``cache store`` (after the answer went out). Points the request never reached are
left out; a segment that would end before it starts is zero long, never negative.

A realtime session (docs/spec.md §19) is one record too, its ``GET /v1/realtime`` with status
101: the hops are the handshake's and the session's (the upstream attempt lasts as long as the
session), and ``realtime`` holds what the session set on its context at the end (messages each
way, the close code and who closed, its last responses with TTFT, tokens and cost). Plain
requests have no ``realtime`` key. :func:`stats` leaves sessions out. An MCP request
(docs/spec.md §23) has an ``mcp`` key: server, method, tool, status and session id; an A2A
call (§30) an ``a2a`` key: agent, method, task id, task state and status.

Prompts and completions are kept (truncated to :data:`CONTENT_LIMIT` characters) only when the
buffer is made with ``capture=True`` (``tracing.capture_content``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from gateway.budgets.spend import cost
from gateway.context import Attempt, RequestContext
from gateway.telemetry.spans import EdgeHop

CONTENT_LIMIT = 4096
ERROR_MESSAGE_LIMIT = 300
#: events a watcher may fall behind before it is dropped
WATCHER_QUEUE = 256
PERCENTILES = (50, 90, 99)
_MCP_FIELDS = ("server", "method", "tool", "status", "session")
_A2A_FIELDS = ("agent", "method", "task", "state", "status")

#: (backend, number, start, first_byte, end, status, error type, error message)
_AttemptRow = tuple[str, int, float, float | None, float | None, int | None, str | None, str]

# positions in a snapshot tuple (see snapshot())
(
    _SEQ,
    _WALL_NS,
    _RECEIVED,
    _INTAKE_DONE,
    _AUTH_DONE,
    _ROUTED,
    _CLIENT_FIRST_BYTE,
    _FIRST_CONTENT,
    _DONE,
    _EDGES,
    _ATTEMPTS,
    _CACHE,
    _REQUEST_ID,
    _TRACE,
    _METHOD,
    _PATH,
    _MODEL,
    _ROUTE,
    _STREAM,
    _TENANT,
    _STATUS,
    _ERROR,
    _TOKENS,
    _EDGE_MARKS,
    _CONTENT,
    _BACKOFF,
    _REALTIME,
    _MCP,
    _A2A,
) = range(29)


def _attempt_row(a: Attempt) -> _AttemptRow:
    e = a.error
    kind = (e.code or e.type) if e is not None else None
    message = e.message[:ERROR_MESSAGE_LIMIT] if e is not None else ""
    return (a.backend.name, a.number, a.start, a.first_byte, a.end, a.status, kind, message)


def snapshot(ctx: RequestContext, edges: list[EdgeHop], seq: int, capture: bool) -> tuple[Any, ...]:
    """The numbers of one finished request, as one flat tuple (cheap: no formatting).

    Only tuples, numbers and strings: such a tuple is untracked by the garbage collector once
    it has been looked at, so 500 of them in the ring — each surviving long enough to reach the
    oldest generation and dying there — add nothing to the collector's full walks (as lists
    and dicts in it did: measured at ~10 µs a request in ``loadtests/features.py``). The one
    exception is a realtime session's ``ctx.realtime`` (a mapping the session made once, at its
    end, kept by reference): sessions are few, and the tuple of a plain request holds None."""
    t = ctx.timeline
    call = ctx.call
    answer = ctx.answer
    c = ctx.cache
    trace = ctx.trace
    error = answer.error
    kind = answer.error_type()
    return (
        seq,
        t.wall_ns,
        t.received,
        t.intake_done,
        t.auth_done,
        t.routed,
        t.client_first_byte,
        t.first_content,
        t.done if t.done is not None else t.received,
        tuple(edges),
        tuple([_attempt_row(a) for a in ctx.attempts]) if ctx.attempts else (),
        (c.result, c.lookup_start, c.lookup_end, c.store_start, c.store_end, c.error),
        ctx.request_id,
        (trace.trace_id, trace.sampled) if trace is not None else None,
        ctx.method,
        ctx.path,
        ctx.model,
        call.route.name if call is not None else None,
        call.stream if call is not None else False,
        ctx.tenant,
        answer.status,
        None if kind is None else (kind, error.message[:ERROR_MESSAGE_LIMIT] if error else ""),
        (answer.input_tokens, answer.output_tokens, cost(ctx)),  # docs/spec.md §20
        tuple(ctx.edge_marks.items()) if ctx.edge_marks else (),
        _content(ctx) if capture else None,
        t.backoff,
        ctx.realtime,  # a session's facts: one small mapping made at its end, kept as is
        _mcp(ctx.mcp) if ctx.mcp is not None else None,
        _facts(ctx.a2a, _A2A_FIELDS) if ctx.a2a is not None else None,
    )


def _mcp(facts: Mapping[str, Any]) -> tuple[Any, ...]:
    """An MCP request's facts (docs/spec.md §23) as strings in a tuple (untracked by the GC)."""
    return _facts(facts, _MCP_FIELDS)


def _facts(facts: Mapping[str, Any], fields: tuple[str, ...]) -> tuple[Any, ...]:
    """An MCP request's or A2A call's facts (docs/spec.md §23, §30) as strings in a tuple."""
    return tuple(str(v) if v is not None else None for v in (facts.get(k) for k in fields))


def _content(ctx: RequestContext) -> tuple[str | None, str | None]:
    """Prompt and completion (only with ``tracing.capture_content``), truncated."""
    payload = ctx.call.payload if ctx.call is not None else {}
    prompt = payload.get("messages", payload.get("prompt", payload.get("input")))
    text = orjson.dumps(prompt).decode()[:CONTENT_LIMIT] if prompt is not None else None
    captured = ctx.answer.captured
    completion = "".join(captured)[:CONTENT_LIMIT] if captured else None
    return text, completion


# ---------------------------------------------------------------- formatting (on read)


def _r(ms: float) -> float:
    return round(ms, 3)


class _Clock:
    """Offsets (ms) from the waterfall's origin: the first edge hop's start, else received."""

    __slots__ = ("done", "edge_ms", "received")

    def __init__(self, snap: tuple[Any, ...]) -> None:
        edges: Sequence[EdgeHop] = snap[_EDGES]
        self.received: float = snap[_RECEIVED]
        self.done: float = snap[_DONE]
        received_epoch = snap[_WALL_NS] / 1e9
        self.edge_ms = max(0.0, (received_epoch - edges[0][2]) * 1000) if edges else 0.0

    def at(self, t: float) -> float:
        return self.edge_ms + (t - self.received) * 1000


def _segment(name: str, kind: str, start_ms: float, end_ms: float, **extra: Any) -> dict[str, Any]:
    start = _r(start_ms)
    return {
        "name": name,
        "kind": kind,
        "start_ms": start,
        "dur_ms": _r(_r(end_ms) - start),
        **extra,
    }


def _edge_segments(snap: tuple[Any, ...], clock: _Clock) -> list[dict[str, Any]]:
    edges: Sequence[EdgeHop] = snap[_EDGES]
    if not edges:
        return []
    origin = edges[0][2]
    out = []
    for name, index, start, end in edges:
        s, e = (start - origin) * 1000, (end - origin) * 1000
        out.append(_segment(name, "edge", s, max(s, e), index=index, source="header"))
    # the last edge hop ends at received: let float rounding never open a gap before auth
    last = out[-1]
    last["dur_ms"] = _r(_r(clock.edge_ms) - last["start_ms"])
    return out


_Interval = tuple[str, str, float, float, dict[str, Any]]


def _gateway_intervals(snap: tuple[Any, ...]) -> Iterator[_Interval]:
    """(name, kind, start, end, extra) in perf_counter seconds, as the spans draw them."""
    intake_done, auth_done, routed = snap[_INTAKE_DONE], snap[_AUTH_DONE], snap[_ROUTED]
    done = snap[_DONE]
    attempts: Sequence[_AttemptRow] = snap[_ATTEMPTS]
    yield "intake", "gateway", snap[_RECEIVED], intake_done, {}
    yield "auth", "gateway", intake_done, auth_done if auth_done is not None else done, {}
    if auth_done is None:
        return
    router_end = routed
    if router_end is None:
        router_end = attempts[0][2] if attempts else done
    yield "router", "gateway", auth_done, router_end, {}
    for backend, number, start, first_byte, end, status, kind, _message in attempts:
        extra = {"attempt": number, "backend": backend, "status": status, "error": kind}
        if first_byte is not None:
            extra["first_byte"] = first_byte
        yield "upstream", "upstream", start, end if end is not None else done, extra


def _clamped(snap: tuple[Any, ...]) -> list[tuple[float, _Interval, bool]]:
    """The intervals made to follow each other inside [received, done], each with where the
    one before it ended and whether the gap between them lies between two attempts."""
    done = snap[_DONE]
    cursor = snap[_RECEIVED]
    previous = ""
    out = []
    for name, kind, start, end, extra in _gateway_intervals(snap):
        s = min(max(start, cursor), done)
        e = min(max(end, s), done)
        out.append((cursor, (name, kind, s, e, extra), previous == name == "upstream"))
        cursor, previous = e, name
    return out


def waterfall(snap: tuple[Any, ...], clock: _Clock | None = None) -> list[dict[str, Any]]:
    """The segments that tile the request (see the module docstring)."""
    clock = clock or _Clock(snap)
    out = _edge_segments(snap, clock)
    done = snap[_DONE]
    intervals = _clamped(snap)
    # the waits, shared among the gaps between attempts (the Timeline keeps their total)
    between = sum(iv[2] - gap_start for gap_start, iv, retry in intervals if retry)
    share = min(1.0, snap[_BACKOFF] / between) if between > 0 else 0.0
    end = snap[_RECEIVED]
    for gap_start, (name, kind, s, e, extra), retry in intervals:
        if s > gap_start:  # between two intervals: preparing an attempt, waiting to retry
            wait_from = max(gap_start, s - (s - gap_start) * share) if retry else s
            if wait_from > gap_start:
                out.append(_segment("gateway", "gap", clock.at(gap_start), clock.at(wait_from)))
            if s > wait_from:
                out.append(_segment("backoff", "backoff", clock.at(wait_from), clock.at(s)))
        first_byte = extra.pop("first_byte", None)
        if first_byte is not None:
            extra["first_byte_ms"] = _r(clock.at(min(max(first_byte, s), e)))
        out.append(_segment(name, kind, clock.at(s), clock.at(e), **extra))
        end = e
    if end < done:
        tail = "relay" if snap[_ATTEMPTS] else "replay" if snap[_ROUTED] is not None else "respond"
        out.append(_segment(tail, "gateway", clock.at(end), clock.at(done)))
    return out


def _details(snap: tuple[Any, ...], clock: _Clock) -> list[dict[str, Any]]:
    result, lookup_start, lookup_end, store_start, store_end, error = snap[_CACHE]
    done = snap[_DONE]
    out = []
    if lookup_start is not None:
        end = lookup_end if lookup_end is not None else done
        out.append(_segment("cache lookup", "cache", clock.at(lookup_start), clock.at(end)))
    if store_start is not None:
        end = store_end if store_end is not None else done
        out.append(_segment("cache store", "cache", clock.at(store_start), clock.at(end)))
    for d in out:
        d["parent"] = "router" if d["name"] == "cache lookup" else None
        d["result"] = result
        d["error"] = bool(error)
    return out


def _timings(snap: tuple[Any, ...]) -> dict[str, Any]:
    received, done = snap[_RECEIVED], snap[_DONE]
    request_s = done - received
    upstream_s = 0.0
    for a in snap[_ATTEMPTS]:
        upstream_s += (a[4] if a[4] is not None else done) - a[2]
    first = snap[_FIRST_CONTENT]
    backoff_s = snap[_BACKOFF]
    return {
        "request_ms": _r(request_s * 1000),
        "upstream_ms": _r(upstream_s * 1000),
        "backoff_ms": _r(backoff_s * 1000),
        # a wait between attempts is neither the upstream's time nor the gateway's own
        "overhead_ms": _r(max(0.0, request_s - upstream_s - backoff_s) * 1000),
        "ttft_ms": _r((first - received) * 1000) if first is not None else None,
    }


def format_record(snap: tuple[Any, ...]) -> dict[str, Any]:
    """One request as the view and ``GET {ui.path}api/requests`` show it."""
    clock = _Clock(snap)
    attempts: Sequence[_AttemptRow] = snap[_ATTEMPTS]
    trace = snap[_TRACE]
    error = snap[_ERROR]
    timings = _timings(snap)
    marks: dict[str, float | None] = {"client_first_byte_ms": None, "first_content_ms": None}
    if snap[_CLIENT_FIRST_BYTE] is not None:
        marks["client_first_byte_ms"] = _r(clock.at(snap[_CLIENT_FIRST_BYTE]))
    if snap[_FIRST_CONTENT] is not None:
        marks["first_content_ms"] = _r(clock.at(snap[_FIRST_CONTENT]))
    record: dict[str, Any] = {
        "seq": snap[_SEQ],
        "id": snap[_REQUEST_ID],
        "trace_id": f"{trace[0]:032x}" if trace is not None else None,
        "sampled": bool(trace and trace[1]),
        "time": round(snap[_WALL_NS] / 1e9, 6),
        "method": snap[_METHOD],
        "path": snap[_PATH],
        "model": snap[_MODEL],
        "route": snap[_ROUTE],
        "backend": attempts[-1][0] if attempts else None,
        "status": snap[_STATUS],
        "cache": snap[_CACHE][0],
        "tenant": snap[_TENANT],
        "stream": snap[_STREAM],
        "error": {"type": error[0], "message": error[1]} if error is not None else None,
        **timings,
        "edge_ms": _r(clock.edge_ms),
        "total_ms": _r(clock.edge_ms + timings["request_ms"]),
        "tokens": {"input": snap[_TOKENS][0], "output": snap[_TOKENS][1]},
        "cost_usd": snap[_TOKENS][2],
        "attempts": [_attempt_json(a, clock, snap[_DONE]) for a in attempts],
        "hops": waterfall(snap, clock),
        "details": _details(snap, clock),
        "marks": marks,
        "edge_discarded": dict(snap[_EDGE_MARKS]),
    }
    if snap[_CONTENT] is not None:
        record["input"], record["output"] = snap[_CONTENT]
    if snap[_REALTIME] is not None:
        record["realtime"] = realtime_json(snap[_REALTIME])
    if snap[_MCP] is not None:  # a tool call (or another MCP request) beside the model calls
        record["mcp"] = dict(zip(_MCP_FIELDS, snap[_MCP], strict=True))
    if snap[_A2A] is not None:  # a call to an agent (docs/spec.md §30)
        record["a2a"] = dict(zip(_A2A_FIELDS, snap[_A2A], strict=True))
    return record


def realtime_json(facts: Mapping[str, Any]) -> dict[str, Any]:
    """A realtime session's facts as the record's ``realtime`` (docs/spec.md §19): messages each
    way, how it closed, its last responses with TTFT (copied: the record is the view's own).

    >>> realtime_json({"messages_in": 3, "responses": [{"id": "r1", "ttft_ms": 4.5}]})
    {'messages_in': 3, 'responses': [{'id': 'r1', 'ttft_ms': 4.5}]}
    """
    out = dict(facts)
    out["responses"] = [dict(r) for r in facts.get("responses") or ()]
    return out


def _attempt_json(a: _AttemptRow, clock: _Clock, done: float) -> dict[str, Any]:
    backend, number, start, first_byte, end, status, kind, message = a
    return {
        "number": number,
        "backend": backend,
        "status": status,
        "error": {"type": kind, "message": message} if kind is not None else None,
        "start_ms": _r(clock.at(start)),
        "first_byte_ms": _r(clock.at(first_byte)) if first_byte is not None else None,
        "end_ms": _r(clock.at(end if end is not None else done)),
        "dur_ms": _r(((end if end is not None else done) - start) * 1000),
    }


def percentiles(values: Iterable[float], ps: Sequence[int] = PERCENTILES) -> dict[str, Any]:
    """Nearest-rank percentiles (the page computes them the same way).

    >>> percentiles([5.0, 1.0, 3.0, 2.0, 4.0])
    {'count': 5, 'p50': 3.0, 'p90': 5.0, 'p99': 5.0}
    >>> percentiles([])
    {'count': 0, 'p50': None, 'p90': None, 'p99': None}
    """
    ordered = sorted(values)
    n = len(ordered)
    out: dict[str, Any] = {"count": n}
    for p in ps:
        out[f"p{p}"] = ordered[max(0, math.ceil(p / 100 * n) - 1)] if n else None
    return out


def stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """p50/p90/p99 of request time, overhead and TTFT over the requests among ``records``.

    Realtime sessions are left out: a session's "request time" is how long it stayed open (up
    to an hour), which says nothing about the gateway's latency; their responses' TTFT are in
    their ``realtime`` records (and in ``gateway_time_to_first_token_seconds``)."""
    requests = [r for r in records if r.get("realtime") is None]
    return {
        key: percentiles([r[key] for r in requests if r[key] is not None])
        for key in ("request_ms", "overhead_ms", "ttft_ms", "upstream_ms")
    }


# ---------------------------------------------------------------- the sink


class Watcher:
    """One live-feed subscriber: a bounded queue of encoded records; ``None`` ends it."""

    __slots__ = ("dropped", "queue")

    def __init__(self, size: int = WATCHER_QUEUE) -> None:
        #: (seq, the record as JSON) items; None ends the feed
        self.queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue(size)
        self.dropped = False

    def offer(self, item: tuple[int, bytes]) -> bool:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            return False
        return True

    def close(self) -> None:
        """Wake the reader with the end marker (making room for it if it is full)."""
        while True:
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()


class RecentRequests:
    """A bounded ring buffer of finished requests and the live feed's watchers.

    It runs on the event loop (every sink does): no locks.
    """

    def __init__(self, size: int, capture: bool = False) -> None:
        self._buffer: deque[tuple[Any, ...]] = deque(maxlen=size)
        self._seq = itertools.count(1)
        self._capture = capture
        self._watchers: set[Watcher] = set()
        #: seq -> formatted record (records never change once finished; formatted once)
        self._formatted: dict[int, dict[str, Any]] = {}
        self.size = size
        #: watchers dropped because they fell behind
        self.dropped_watchers = 0

    def __call__(self, ctx: RequestContext, edges: list[EdgeHop]) -> None:
        """The Telemetry sink: one append (and, only while someone watches, a publish)."""
        snap = snapshot(ctx, edges, next(self._seq), self._capture)
        self._buffer.append(snap)
        if self._watchers:
            self._publish(snap)

    def __len__(self) -> int:
        return len(self._buffer)

    @property
    def last_seq(self) -> int:
        return self._buffer[-1][_SEQ] if self._buffer else 0

    def records(self, after: int = 0) -> list[dict[str, Any]]:
        """Formatted records newer than sequence number ``after``, newest first."""
        out = []
        for snap in reversed(self._buffer):
            if snap[_SEQ] <= after:
                break  # the buffer is in sequence order
            out.append(self._format(snap))
        return out

    def _format(self, snap: tuple[Any, ...]) -> dict[str, Any]:
        formatted = self._formatted
        record = formatted.get(snap[_SEQ])
        if record is None:
            record = formatted[snap[_SEQ]] = format_record(snap)
            if len(formatted) > 2 * self.size:  # forget what fell out of the buffer
                oldest = self._buffer[0][_SEQ]
                self._formatted = {k: v for k, v in formatted.items() if k >= oldest}
        return record

    def watch(self, after: int | None = None, size: int = WATCHER_QUEUE) -> Watcher:
        """A new watcher; with ``after`` it first gets the buffered records newer than that
        (oldest first), with nothing lost or doubled between them and the live ones."""
        w = Watcher(size)
        if after is not None:
            backlog = [s for s in self._buffer if s[_SEQ] > after][-size:]
            for snap in backlog:
                w.offer((snap[_SEQ], orjson.dumps(self._format(snap))))
        self._watchers.add(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        self._watchers.discard(w)

    def _publish(self, snap: tuple[Any, ...]) -> None:
        data = (snap[_SEQ], orjson.dumps(self._format(snap)))  # once for every watcher
        for w in list(self._watchers):
            if not w.offer(data):  # fell behind: dropped, never waited for
                self._watchers.discard(w)
                w.dropped = True
                self.dropped_watchers += 1
                w.close()

    def close(self) -> None:
        """End every watcher's feed (shutdown)."""
        for w in list(self._watchers):
            w.close()
        self._watchers.clear()


__all__ = [
    "RecentRequests",
    "Watcher",
    "format_record",
    "percentiles",
    "realtime_json",
    "snapshot",
    "stats",
]
