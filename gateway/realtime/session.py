"""A realtime session: ``GET /v1/realtime?model=M`` over WebSocket, end to end (docs/spec.md §19).

A WebSocket session is a long request (docs/architecture.md, "the next floors"): one context
and one Timeline per session, the same hops before the upgrade, then the relay::

    edge    → trust, request id, trace ids; the key from Authorization or from the browser's
              ``openai-insecure-api-key.<key>`` subprotocol (stripped before anything goes on)
    auth    → 401 / 429 (rpm counts a session start), as HTTP answers in the OpenAI error shape
    router  → model from the query: 400 without one, 403 not allowed for the key, 404 no route
    upstream→ the handshake: attempts, retries, fallback; every attempt failed → 502 / 504 (or
              the upstream's own error status and body) — never an accepted socket closed at once
    accept  → the subprotocol the upstream selected, x-request-id, traceresponse
    relay   → :class:`~gateway.realtime.message_relay.MessageRelay` until either side ends or a
              limit stops it
    finish  → spans, metrics, one access-log line, the live view, passive health

Telemetry of each model response (its span, TTFT, tokens, the ``tpm`` debit) happens as its
``response.done`` passes, not at the session's end: a session may last an hour.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qsl

import orjson

from gateway.context import RECEIVED_AT, Attempt, Call, RequestContext, Usage
from gateway.errors import ClientGone, Forbidden, GatewayError, InvalidRequest, NotFound
from gateway.fleet.health import CONNECTION_FAILED, SUCCESS
from gateway.hops.router import MAX_MODEL_CHARS
from gateway.realtime.client_end import CLIENT_END, ClientEnd
from gateway.realtime.events import ModelResponse, OnDone, SessionResponses
from gateway.realtime.handshake import Handshake
from gateway.realtime.message_relay import BY_SHUTDOWN, BY_UPSTREAM, End, MessageRelay
from gateway.realtime.spans import ROUTE, SessionFacts, response_span, session_spans
from gateway.realtime.upstream_socket import UpstreamSocket
from gateway.runtime import Runtime
from gateway.telemetry.logs import line
from gateway.telemetry.server_timing import edge_intervals
from gateway.types import Message, Receive, Scope, Send
from gateway.writer import ResponseWriter

log = logging.getLogger("gateway")

#: the subprotocol a browser carries its key in (it cannot set Authorization on a WebSocket)
KEY_SUBPROTOCOL = "openai-insecure-api-key."
_MODEL = re.compile(r"[^\x00-\x1f\x7f]{1,%d}" % MAX_MODEL_CHARS)  # noqa: UP031
#: the ASGI extension that lets an app answer a WebSocket handshake with an HTTP response
_HTTP_RESPONSE = "websocket.http.response"
#: the finished responses of a session the live view keeps (the most recent ones)
RESPONSES_KEPT = 50
#: a draining session is closed this long before the server's shutdown grace is over
DRAIN_MARGIN_S = 1.0
#: a draining session waits this long for a response asked for (or a VAD turn) to start
DRAIN_ASKED_S = 2.0


def http_send(scope: Scope, send: Send) -> Send:
    """``send`` for answering the handshake as HTTP (the ``websocket.http.response`` extension):
    the response writer's ``http.response.*`` messages, renamed. A server without the
    extension can only refuse: ``websocket.close`` before accepting is a 403."""
    if _HTTP_RESPONSE not in (scope.get("extensions") or {}):

        async def refuse(message: Any) -> None:
            if message["type"] == "http.response.start":
                await send({"type": "websocket.close", "code": 1008})

        return refuse

    async def translated(message: Any) -> None:
        if message["type"] == "http.response.start":
            await send({**message, "type": "websocket.http.response.start"})
        else:
            await send(
                {
                    "type": "websocket.http.response.body",
                    "body": message.get("body", b""),
                    "more_body": message.get("more_body", False),
                }
            )

    return translated


class OpenSession:
    """One session as the live view sees it (:class:`gateway.context.LiveSession`): registered
    in ``Runtime.sessions`` while open, its :meth:`summary` set on the context at the end.
    Nothing here runs per message: the relay's counters are read when somebody looks."""

    __slots__ = ("_server", "_timer", "ctx", "done", "draining", "facts", "relay", "responses")

    def __init__(
        self, ctx: RequestContext, facts: SessionFacts, responses: SessionResponses
    ) -> None:
        self.ctx = ctx
        self.facts = facts
        self.responses = responses
        self.relay: MessageRelay | None = None
        #: the most recent finished responses
        self.done: deque[ModelResponse] = deque(maxlen=RESPONSES_KEPT)
        #: the server is shutting down: close once no response is in progress
        self.draining = False
        self._server: ClientEnd | None = None
        self._timer: asyncio.TimerHandle | None = None

    def attach(self, relay: MessageRelay, rt: Runtime, server: object) -> None:
        """The relay runs: the session is open for the live view (keyed by the object: two
        sessions may carry the same x-request-id), and drains when the server (the client's
        connection, when it is the gateway's own protocol) shuts down."""
        self.relay = relay
        rt.sessions[id(self)] = self
        if isinstance(server, ClientEnd):
            server.drain = partial(self.drain, rt.config.server.shutdown_grace_s)
            self._server = server

    def detach(self, rt: Runtime) -> None:
        rt.sessions.pop(id(self), None)
        if self._server is not None:
            self._server.drain = None
            self._server = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def drain(self, grace_s: float) -> None:
        """The server stops: close with 1012 (the client reconnects, to another replica) once
        the response in progress is done — at once when none is — and in any case a second
        before the server's grace is over, so a close frame goes out rather than a cut."""
        if self.relay is None:
            return
        self.draining = True
        if self._drained():
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, grace_s - DRAIN_MARGIN_S), self._restart)
        if not self.responses.in_progress:  # asked for, not started: look again when stale
            loop.call_later(DRAIN_ASKED_S + 0.01, self._drained)

    def response_ended(self) -> None:
        """A response is done: while draining, the session closes once none is left."""
        if self.draining:
            self._drained()

    def _drained(self) -> bool:
        if self.responses.idle(time.perf_counter(), DRAIN_ASKED_S):
            self._restart()
            return True
        return False

    def _restart(self) -> None:
        if self.relay is not None:
            self.relay.stop(1012, "service restart", BY_SHUTDOWN)

    def summary(self) -> dict[str, Any]:
        """Messages each way, the close, the responses with TTFT (docs/spec.md §19)."""
        facts = self.facts
        stats = self.relay.stats if self.relay is not None else None
        return {
            "messages_in": stats.messages_in if stats is not None else facts.messages_in,
            "messages_out": stats.messages_out if stats is not None else facts.messages_out,
            "close_code": facts.close_code,
            "closed_by": facts.by,
            "close_reason": facts.close_reason,
            "responses_total": self.responses.count,
            "responses": [r.view() for r in self.done],
        }

    def view(self) -> dict[str, Any]:
        """An open session, for ``GET /_gateway/api/realtime``."""
        ctx = self.ctx
        attempt = ctx.attempts[-1] if ctx.attempts else None
        return {
            "request_id": ctx.request_id,
            "model": ctx.model,
            "tenant": ctx.tenant,
            "route": ctx.call.route.name if ctx.call is not None else None,
            "backend": attempt.backend.name if attempt is not None else None,
            "started_ns": ctx.timeline.wall_ns,
            "duration_ms": round((time.perf_counter() - ctx.timeline.received) * 1000, 3),
            "open": True,
            **self.summary(),
        }


def _server_end(connect: Message) -> ClientEnd | None:
    """The gateway's own server offers its end of the connection in ``websocket.connect``: the
    relay's direct path and the session's drain register there."""
    end = connect.get(CLIENT_END)
    return end if isinstance(end, ClientEnd) else None


class Realtime:
    """``GET /v1/realtime`` of one runtime: sessions, each in its own context."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.config = rt.config.realtime
        tracing = rt.tracing
        self._traced = tracing.enabled
        self.handshake = Handshake(
            rt.health,
            tracing.attempt_headers if tracing.enabled else None,
            tracing.new_span_id,
        )
        metrics = rt.telemetry.metrics
        self.metrics = metrics
        self._hop_base = tracing.edge_hop_count
        nothing: Callable[[float], None] = lambda _s: None  # noqa: E731
        self._observe_in, self._observe_out = nothing, nothing
        if metrics is not None:
            hist = metrics.realtime.message_overhead
            c2u, u2c = ("client_to_upstream",), ("upstream_to_client",)
            # one C call per message: no Python frame between the relay and the histogram
            self._observe_in = partial(hist.observe, c2u)
            self._observe_out = partial(hist.observe, u2c)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        received = connect.get(RECEIVED_AT)
        if received is not None:
            scope[RECEIVED_AT] = received
        scope["method"] = "GET"  # a WebSocket scope has none; the handshake is a GET
        rt = self.rt
        ctx = rt.edge.accept(scope)
        ctx.timeline.intake_done = time.perf_counter()
        offered = _take_key(ctx, scope.get("subprotocols") or ())
        ctx.response_headers.append((b"x-request-id", ctx.request_id.encode()))
        self._begin_trace(ctx)
        out = ResponseWriter(ctx, http_send(scope, send), rt.telemetry.headers_at_start)
        facts = SessionFacts()
        upstream: UpstreamSocket | None = None
        responses = SessionResponses(_guarded(lambda r: self._response_done(ctx, r, live)))
        live = OpenSession(ctx, facts, responses)
        end: End | None = None
        relay: MessageRelay | None = None
        try:
            await rt.auth.check(ctx)  # 401, 429: rpm counts a session start
            call = self._route(ctx)  # 400, 403, 404
            upstream, attempt = await self.handshake.open(
                ctx, call.route.backends, call.route.config.retries, offered,
                self.config.max_message_bytes,
            )  # fmt: skip
            facts.handshake_done = attempt.first_byte
            await self._accept(ctx, send, upstream, facts)
            relay = MessageRelay(
                receive,
                send,
                upstream,
                responses,
                max_message_bytes=self.config.max_message_bytes,
                idle_timeout_s=self.config.idle_timeout_s,
                max_session_s=self.config.max_session_s,
                observe_in=self._observe_in,
                observe_out=self._observe_out,
                server_end=_server_end(connect),
            )
            live.attach(relay, rt, relay.server_end)
            end = await relay.run()
        except GatewayError as exc:
            ctx.answer.error = exc
            if facts.accepted is None:
                await _answer(out, exc)
        except ClientGone:
            ctx.disconnected = True
        except asyncio.CancelledError:  # the server is stopping: the upstream is closed below
            ctx.disconnected = True
            raise
        finally:
            if upstream is not None and end is None:  # accepted but the relay never ran
                await upstream.close(1001, "client went away")
            if relay is not None:
                live.detach(rt)
                facts.count(relay.stats)
            self._finish(ctx, facts, end, live)

    # ------------------------------------------------------------ before the upgrade

    def _begin_trace(self, ctx: RequestContext) -> None:
        if self._traced:
            self.rt.tracing.begin(ctx, ctx.incoming_trace)
        elif ctx.incoming_trace is not None:  # not tracing: stay transparent to the client's
            tp, ts = ctx.incoming_trace
            ctx.upstream_headers.append(("traceparent", tp.decode("latin-1")))
            if ts:
                ctx.upstream_headers.append(("tracestate", ts.decode("latin-1")))

    def _route(self, ctx: RequestContext) -> Call:
        model = dict(parse_qsl(ctx.query.decode("latin-1"))).get("model")
        if not model:
            raise InvalidRequest(
                "a realtime session needs a model: /v1/realtime?model=<model>", code="missing_model"
            )
        if not _MODEL.fullmatch(model):
            raise InvalidRequest(
                f"'model' must be 1-{MAX_MODEL_CHARS} characters without control characters",
                code="invalid_model",
            )
        ctx.model = model
        if ctx.permits is not None and not ctx.permits(model):
            raise Forbidden(f"this API key may not call model {model!r}", code="model_not_allowed")
        route = self.rt.router.match(model)
        if route is None:
            raise NotFound(f"no route for model {model!r}", code="model_not_found")
        key = ctx.limit_key
        if key is not None and key.budgeted and not self.rt.auth.prices.of(model):
            # its responses could not be priced: it would spend unmetered (as for HTTP)
            raise Forbidden(
                f"this API key has a budget and model {model!r} has no price: "
                "add a [[prices]] entry for it (docs/spec.md §20)",
                code="model_not_priced",
            )
        call = ctx.call = Call(ctx.path, "realtime", b"", {}, True, route)
        ctx.timeline.routed = time.perf_counter()
        return call

    async def _accept(
        self, ctx: RequestContext, send: Send, upstream: UpstreamSocket, facts: SessionFacts
    ) -> None:
        headers = list(ctx.response_headers)
        tr = self.rt.tracing.traceresponse(ctx) if self._traced else None
        if tr is not None:
            headers.append(tr)
        try:
            await send(
                {
                    "type": "websocket.accept",
                    "subprotocol": upstream.subprotocol,
                    "headers": headers,
                }
            )
        except OSError as exc:  # the client left during the handshake
            raise ClientGone() from exc
        facts.accepted = ctx.timeline.client_first_byte = time.perf_counter()
        ctx.answer.status = 101
        if self.metrics is not None:
            self.metrics.realtime.open += 1

    # ------------------------------------------------------------ responses, as they end

    def _response_done(
        self, ctx: RequestContext, response: ModelResponse, live: OpenSession
    ) -> None:
        """Telemetry of one model response, when its ``response.done`` was written: tokens,
        cost (docs/spec.md §20), the ``tpm`` and budget debit, its span, the live view."""
        live.done.append(response)
        ctx.conversation_id = live.responses.session_id  # gen_ai.conversation.id
        usage = _usage(response)
        if usage is not None:
            _add_usage(ctx.answer.tokens, usage)  # the session's totals: its span, log, record
            price = self.rt.auth.prices.for_request(ctx)
            if price is not None:
                response.cost_usd = price.cost(usage)
        metrics = self.metrics
        if metrics is not None:
            model = metrics.model_label(ctx)
            ttft = response.ttft()
            if ttft is not None:
                metrics.ttft.observe((model,), ttft)
            if usage is not None:
                metrics.count_tokens(
                    model, usage.input, usage.output, usage.cached_input, None, usage.reasoning
                )
                if response.cost_usd is not None:
                    route = ctx.call.route.name if ctx.call is not None else "none"
                    metrics.spend.cost.inc((route, model, ctx.tenant or "-"), response.cost_usd)
                else:
                    metrics.spend.unpriced.inc((model,))
        if usage is not None:
            _debit(self.rt, ctx, usage, response.cost_usd)
        self._export_response(ctx, response)
        live.response_ended()

    def _export_response(self, ctx: RequestContext, response: ModelResponse) -> None:
        trace = ctx.trace
        queue = self.rt.tracing.queue
        if trace is None or not trace.sampled or queue is None:
            return
        provider = ctx.attempts[-1].backend.provider if ctx.attempts else "openai"
        queue.put([response_span(ctx, trace, response, provider)])

    # ------------------------------------------------------------ the end

    def _finish(
        self, ctx: RequestContext, facts: SessionFacts, end: End | None, live: OpenSession
    ) -> None:
        responses = live.responses
        ctx.conversation_id = responses.session_id  # gen_ai.conversation.id
        t = ctx.timeline
        t.done = done = time.perf_counter()
        if end is not None:
            facts.close_code, facts.close_reason, facts.by = end.code, end.reason, end.by
        for response in responses.unfinished():  # cut by the session's end
            response.status = "unfinished"
            response.done = done
            self._export_response(ctx, response)
        facts.responses = responses.count
        if ctx.disconnected and ctx.answer.status < 400 and facts.accepted is None:
            ctx.answer.status = 499
        self._settle(ctx, end, done)
        edges = edge_intervals(ctx)
        trace = ctx.trace
        queue = self.rt.tracing.queue
        if trace is not None and trace.sampled and queue is not None:
            queue.put(
                session_spans(ctx, trace, edges, self._hop_base, facts, self.rt.tracing.auth_mode)
            )
        self._metrics(ctx, facts, edges)
        _log(self.rt, ctx, facts)
        recent = self.rt.recent
        if recent is not None:
            if facts.accepted is not None:
                ctx.realtime = live.summary()
            recent(ctx, edges)

    def _settle(self, ctx: RequestContext, end: End | None, done: float) -> None:
        """Passive health: the accepted attempt's outcome is the session's (an upstream that
        vanished mid-session failed; any other end succeeded). Its end is the session's: the
        upstream connection lasted that long (``upstream_time``; the CLIENT span ends at the
        handshake)."""
        if ctx.answer.status != 101 or not ctx.attempts:
            return
        attempt: Attempt = ctx.attempts[-1]
        attempt.end = done
        failed = end is not None and end.by == BY_UPSTREAM and end.code == 1011
        self.rt.health.settle(attempt, CONNECTION_FAILED if failed else SUCCESS, ctx.model)

    def _metrics(self, ctx: RequestContext, facts: SessionFacts, edges: Any) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        if facts.accepted is None:  # refused before the upgrade: an HTTP answer like any other
            metrics(ctx, edges)
            return
        metrics.realtime.open -= 1
        code = str(facts.close_code) if facts.close_code is not None else "1006"
        metrics.realtime.sessions.inc((code,))
        route = ctx.call.route.name if ctx.call is not None else "none"
        metrics.requests.inc((route, metrics.model_label(ctx), "101"))


def _guarded(done: OnDone) -> OnDone:
    """``done``, called in the relay's read callback: nothing may escape into the connection
    there, or the session would end for a telemetry fault."""

    def on_done(response: ModelResponse) -> None:
        try:
            done(response)
        except Exception:
            log.exception("realtime: the telemetry of a response failed (the session goes on)")

    return on_done


def _take_key(ctx: RequestContext, subprotocols: Any) -> list[str]:
    """The subprotocols to offer upstream: all the client offered but the one carrying its key,
    which becomes the credential when no header carried one (docs/spec.md §19)."""
    offered: list[str] = []
    for proto in subprotocols:
        if isinstance(proto, str) and proto.startswith(KEY_SUBPROTOCOL):
            if not ctx.credential:
                ctx.credential = proto[len(KEY_SUBPROTOCOL) :].encode()
        elif isinstance(proto, str):
            offered.append(proto)
    return offered


async def _answer(out: ResponseWriter, exc: GatewayError) -> None:
    try:
        await out.error(exc)
    except OSError:  # the client left before its answer
        return


__all__ = ["KEY_SUBPROTOCOL", "Realtime", "http_send"]


def _log(rt: Runtime, ctx: RequestContext, facts: SessionFacts) -> None:
    """The session's one access-log line, with its realtime block."""
    access = rt.telemetry.access_log
    if not access.wants(ctx):
        return
    record = line(ctx)
    record["path"] = ROUTE
    if facts.accepted is not None:
        setup_upstream = 0.0
        if ctx.attempts and facts.handshake_done is not None:
            setup_upstream = facts.handshake_done - ctx.attempts[-1].start
        setup = facts.accepted - ctx.timeline.received
        record["overhead_ms"] = round(
            max(0.0, setup - setup_upstream - ctx.timeline.backoff) * 1000, 3
        )
        record["realtime"] = {
            "messages_in": facts.messages_in,
            "messages_out": facts.messages_out,
            "responses": facts.responses,
            "close_code": facts.close_code,
            "closed_by": facts.by,
        }
    access.logger.info(orjson.dumps(record).decode())


def _usage(response: ModelResponse) -> Usage | None:
    """The usage ``response.done`` told, as the one record tokens and cost are read from."""
    if not response.reported():
        return None
    usage = Usage()
    usage.input, usage.output = response.input_tokens, response.output_tokens
    usage.parts(response.cached_tokens, None, response.reasoning_tokens)
    return usage


def _add_usage(total: Usage, usage: Usage) -> None:
    """Add one response's usage to the session's (cost is linear in it: the session's cost is
    the sum of its responses')."""
    total.input = (total.input or 0) + (usage.input or 0)
    total.output = (total.output or 0) + (usage.output or 0)
    total.cached_input += usage.cached_input
    total.reasoning += usage.reasoning


def _debit(rt: Runtime, ctx: RequestContext, usage: Usage, usd: float | None) -> None:
    """``tpm`` and budgets (what the auth hop settles per answer) for one response: the auth
    hop's own end-of-request sink, told about a context holding this response's usage and
    cost only — cached and reasoning tokens included — so the session's running totals are
    never debited twice."""
    if ctx.limit_key is None or not usage.total:
        return
    one = RequestContext(ctx.scope, ctx.timeline)
    one.limit_key, one.tenant, one.model, one.call = (
        ctx.limit_key,
        ctx.tenant,
        ctx.model,
        ctx.call,
    )
    one.attempts = ctx.attempts
    one.answer.tokens = usage
    one.answer.pricing = ctx.answer.pricing
    one.answer.cost_usd, one.answer.costed = usd, True
    rt.auth.finished(one)
