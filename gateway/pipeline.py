"""The model call: a routed request, hop by hop (docs/spec.md §5, docs/architecture.md, "The
request path").

:func:`model_call` is the whole request path of ``POST /v1/chat/completions`` and its siblings,
read top to bottom; each line is one hop, each hop its own module.
"""

from __future__ import annotations

import time

from gateway.cache import follow as cache_follow
from gateway.cache.flight import Flight
from gateway.cache.replay import Entry, replay_events
from gateway.cache.service import CachePlan, Lookup, StreamTee, json_entry
from gateway.context import Call, RequestContext
from gateway.encoding import negotiate
from gateway.errors import NotAcceptable, UpstreamStreamError
from gateway.hops import references
from gateway.hops.edge import read_body
from gateway.hops.ownership import RecordingWriter
from gateway.protocols import BY_PATH
from gateway.routes import Backend
from gateway.runtime import Runtime
from gateway.streaming.bodies import relay_json, replay_json
from gateway.streaming.relay import SSERelay, replay_sse
from gateway.types import Receive, Scope, Send
from gateway.writer import ResponseWriter

# docs/spec.md §9: ask for compressed JSON (decoded here as needed); streams ask for identity,
# since an
# upstream that compresses SSE without a flush per event would hold events back
_UPSTREAM_CODING = ("accept-encoding", "br, zstd, gzip")
_UPSTREAM_STREAM_CODING = ("accept-encoding", "identity")


async def model_call(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    async with rt.request(scope, send, vary=True) as req:  # edge: trust, request id, trace ids
        ctx, out = req.ctx, req.out
        await rt.auth.check(ctx)  # key -> tenant, request budget: before reading any body
        ctx.coding = negotiate_coding(ctx.accept_encoding)  # br | zstd | gzip | identity: 406
        body = await read_body(ctx, receive, rt.max_body)  # bounded, decoded: 413 / 415
        call = rt.router.route(ctx, body)  # parse once, route, policies
        owner = None
        if (named := references.in_call(call)) is not None:  # the stored objects it names:
            owner = await rt.ownership.place(named, ctx.tenant)  # the tenant's, or 404 (§26)
        if BY_PATH[call.path].stateful:  # the Responses API: its state lives on one backend
            out = req.out = recording(rt, call, out)
        lookup = await rt.cache.lookup(ctx, call)  # a hit, an identical call in flight, a miss
        await admit(rt, ctx, call, lookup)  # budgets, tpm, rpm: the worst case reserved
        ctx.timeline.routed = time.perf_counter()
        if lookup.entry is not None:
            await replay(ctx, call, lookup.entry, out, receive)
        elif lookup.follow is not None:
            await follow(rt, ctx, call, lookup.follow, out, receive)
        else:  # upstream attempts → relay (SSE event by event, or JSON) → cache store
            await from_upstream(rt, ctx, call, lookup.plan, out, receive, owner)


def recording(rt: Runtime, call: Call, out: ResponseWriter) -> ResponseWriter:
    """docs/spec.md §22: a Responses answer the upstream will store is recorded as the
    answering backend's before the client gets its first byte (a follow-up through any replica
    then finds it); ``store: false`` answers are kept nowhere, so nothing is recorded."""
    if call.payload.get("store") is False:
        return out
    return RecordingWriter(out, rt.ownership, call.route.config.response_affinity_ttl_s)


async def admit(rt: Runtime, ctx: RequestContext, call: Call, lookup: Lookup) -> None:
    """The key's limits once the body is known (docs/spec.md §20): a cache hit reserves nothing.
    A refused request releases the cache's claim on its key (followers are not left waiting)."""
    try:
        await rt.auth.admit(ctx, call, lookup.entry is None)
    except BaseException:
        if lookup.plan is not None:
            await rt.cache.complete(ctx, lookup.plan, None)
        raise


async def from_upstream(
    rt: Runtime,
    ctx: RequestContext,
    call: Call,
    plan: CachePlan | None,
    out: ResponseWriter,
    receive: Receive,
    owner: Backend | None = None,
) -> None:
    """Attempts (retries, fallback), then the relay; a complete valid answer is stored.

    With an ``owner`` (the backend holding the state a stateful call names) only it is tried,
    pinned: even when ejected, and its error passes through (docs/spec.md §22)."""
    route = call.route
    cfg = route.config
    api = BY_PATH[call.path]
    ctx.upstream_headers.append(_UPSTREAM_STREAM_CODING if call.stream else _UPSTREAM_CODING)
    entry: Entry | None = None
    cut: UpstreamStreamError | None = None
    body = call.body
    asked = ask_usage(rt, ctx, call) if call.stream else None
    if asked is not None:
        body = asked
    try:
        if owner is None:
            resp, attempt = await rt.upstream.forward(
                ctx, route.backends, body, cfg.retries, cfg.retry_on_timeout
            )
        else:
            resp, attempt = await rt.upstream.forward(
                ctx, (owner,), body, cfg.retries, cfg.retry_on_timeout, pinned=True
            )
        if call.stream and resp.status == 200:
            tee = StreamTee(plan) if plan is not None else None
            idle = attempt.backend.config.stream_idle_timeout_s
            relay = SSERelay(ctx, api, resp, attempt, out, idle, tee, asked is not None)
            cut = await relay.run(receive)
            collector = plan.collector if plan is not None else None
            if collector is not None and cut is None and not ctx.disconnected:
                entry = collector.entry(time.time())
        else:
            answer = await relay_json(ctx, api, resp, attempt, out)
            if plan is not None and answer is not None and resp.status == 200:
                entry = json_entry(ctx, call, answer)
    finally:
        if plan is not None:
            error_event = cut.sse_event() if cut is not None else None
            await rt.cache.complete(ctx, plan, entry, error_event)


def ask_usage(rt: Runtime, ctx: RequestContext, call: Call) -> bytes | None:
    """docs/spec.md §20, nothing unbilled: a stream whose model has a price, or whose key
    reserved tokens (``tpm``), asks its upstream for usage when the client did not (chat
    completions and completions: ``stream_options.include_usage``); the relay then keeps the
    usage chunk from the client. Returns the body to send upstream instead (None: unchanged)."""
    if not ctx.answer.reserved_tokens and rt.auth.prices.for_request(ctx) is None:
        return None
    return BY_PATH[call.path].ask_usage(call.body, call.payload)


async def replay(
    ctx: RequestContext, call: Call, entry: Entry, out: ResponseWriter, receive: Receive
) -> None:
    """A cached answer, in the form this request asked for (docs/spec.md §10)."""
    if call.stream and entry.operation != "embeddings":
        await replay_sse(ctx, replay_events(entry, call.wants_usage()), out, receive)
    else:
        await replay_json(ctx, entry.body, out, entry)
    ctx.answer.input_tokens, ctx.answer.output_tokens = entry.tokens


async def follow(
    rt: Runtime,
    ctx: RequestContext,
    call: Call,
    flight: Flight,
    out: ResponseWriter,
    receive: Receive,
) -> None:
    """An identical request is in flight in this process: share its answer."""
    shared = await cache_follow.source(rt.cache, ctx, call, flight)
    if isinstance(shared, Entry):
        await replay(ctx, call, shared, out, receive)
    elif shared is not None:  # the leader is streaming: tail it live
        await replay_sse(ctx, cache_follow.tail_events(shared, call.wants_usage()), out, receive)
        if shared.entry is None:
            ctx.answer.error = UpstreamStreamError(cache_follow.SHARED_CUT)
    else:  # the leader produced nothing to share: ask the upstream ourselves (and store)
        await from_upstream(rt, ctx, call, rt.cache.plan_for_follower(ctx, call), out, receive)


def negotiate_coding(accept_encoding: bytes | None) -> str:
    coding = negotiate(accept_encoding)
    if coding is None:
        raise NotAcceptable(
            "no acceptable Content-Encoding: the gateway answers in br, zstd, gzip or identity",
            code="no_acceptable_encoding",
        )
    return coding
