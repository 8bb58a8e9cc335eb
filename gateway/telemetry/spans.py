"""The span tree of one finished request, written from its Timeline (docs/spec.md §7).

One builder per span kind: edge hops (reconstructed from headers), ``hop intake``, ``hop auth``,
``hop router`` with its ``cache lookup`` child, ``cache store``, one CLIENT span per upstream
attempt, and the SERVER root. Runs once per sampled request on the event loop, after the
response went out; it uses the memoised pieces of :mod:`gateway.telemetry.otlp` so only times,
ids and numbers are encoded per request.
"""

from __future__ import annotations

import random
import struct
from typing import Any, Final

import orjson

from gateway.context import Attempt, RequestContext, TraceContext
from gateway.memo import remember
from gateway.spend import cost
from gateway.telemetry import otlp

EdgeHop = tuple[str, int, float, float]  # (hop name, hop.index, start, end) epoch seconds

_a = otlp.attr
_s = otlp.stable_attr
_f = otlp.float_attr
_str = otlp.str_attr
_i = otlp.int_attr
#: sampled (W3C flag 01) + "parent is local" for every span but the root
_FLAGS = otlp.FLAG_HAS_IS_REMOTE | 0x01
#: the status + flags of every span without an error: encoded once
_TAIL = otlp.tail(otlp.STATUS_UNSET, _FLAGS)
_getrandbits = random.getrandbits
_ZERO_ID = bytes(8)
_times = otlp.pack_times
_double = otlp.pack_double
#: the framing of the root's float attributes: only their 8 value bytes are per request
_F_REQUEST: Final = otlp.float_prefix("gateway.request_time_ms")
_F_UPSTREAM: Final = otlp.float_prefix("gateway.upstream_time_ms")
_F_OVERHEAD: Final = otlp.float_prefix("gateway.overhead_ms")
_F_BODY_READ: Final = otlp.float_prefix("gateway.body_read_ms")
_F_LAG: Final = otlp.float_prefix("gateway.event_loop.lag_ms")
#: the three times every root span has, framing included, packed by one struct call
_pack_root_times = struct.Struct(
    f"<{len(_F_REQUEST)}sd{len(_F_UPSTREAM)}sd{len(_F_OVERHEAD)}sd"
).pack
_GROUPS: dict[tuple[Any, ...], bytes] = {}
_ROOT_NAMES = (
    "http.request.method",
    "url.path",
    "url.scheme",
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
_INTAKE = otlp.name_kind("hop intake", otlp.KIND_INTERNAL)
_AUTH = otlp.name_kind("hop auth", otlp.KIND_INTERNAL)
_ROUTER = otlp.name_kind("hop router", otlp.KIND_INTERNAL)
#: routes whose path is its own http.route; other /v1/* paths are one template
_ROUTE_TEMPLATES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/realtime",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
    }
)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _group(key: tuple[Any, ...], names: tuple[str, ...]) -> bytes:
    """Stable attributes as one memoised block (one dict lookup for the whole group)."""
    got = _GROUPS.get(key)
    if got is None:
        encoded = b"".join(_s(n, v) for n, v in zip(names, key, strict=True) if v is not None)
        got = remember(_GROUPS, key, encoded, 4096)
    return got


def _sid() -> bytes:
    """A random span id: never all zero (invalid, W3C Trace Context)."""
    return (_getrandbits(64) or 1).to_bytes(8, "big")


def route_template(path: str) -> str:
    """The span name's route: the path itself for the gateway's own routes, the Responses API's
    stateful paths with ``{response_id}`` (docs/spec.md §22), ``/v1/{path}`` for the rest — a
    bounded set of names whatever the client sends.

    >>> route_template("/v1/responses/resp_123/input_items")
    '/v1/responses/{response_id}/input_items'
    >>> route_template("/v1/files/file-1"), route_template("/v1/messages/count_tokens")
    ('/v1/files/{file_id}', '/v1/messages/count_tokens')
    >>> route_template("/v1/audio/speech")
    '/v1/{path}'
    """
    if path in _ROUTE_TEMPLATES:
        return path
    if path.startswith("/v1/responses/"):
        rest = path[len("/v1/responses/") :].split("/")
        if len(rest) == 1 or (len(rest) == 2 and rest[1] in ("cancel", "input_items")):
            return "/v1/responses/{response_id}" + ("/" + rest[1] if len(rest) == 2 else "")
    if (stateful := _stateful_template(path)) is not None:
        return stateful
    return "/v1/{path}" if path.startswith("/v1/") else path


#: the stateful collections (docs/spec.md §24) and how their span names call an object's id
_STATEFUL_IDS = {
    "/v1/messages/batches": "{message_batch_id}",
    "/v1/files": "{file_id}",
    "/v1/uploads": "{upload_id}",
    "/v1/batches": "{batch_id}",
    "/v1/conversations": "{conversation_id}",
    "/v1/vector_stores": "{vector_store_id}",
}
_STATEFUL_WORDS = frozenset(
    {
        "content",
        "cancel",
        "parts",
        "complete",
        "items",
        "results",
        "files",
        "file_batches",
        "search",
    }
)


def _stateful_template(path: str) -> str | None:
    """``/v1/files/{file_id}/content``, ``/v1/conversations/{conversation_id}/items/{id}``:
    the ids replaced, any other word as ``{path}`` (bounded names, docs/spec.md §24).

    >>> _stateful_template("/v1/files"), _stateful_template("/v1/files/file-1/content")
    ('/v1/files', '/v1/files/{file_id}/content')
    >>> _stateful_template("/v1/vector_stores/vs_1/files/file-2")
    '/v1/vector_stores/{vector_store_id}/files/{id}'
    >>> _stateful_template("/v1/batches/b/x/y/z"), _stateful_template("/v1/chat/completions")
    ('/v1/batches/{batch_id}/{path}/{id}/{path}', None)
    """
    for root, name in _STATEFUL_IDS.items():
        if path == root:
            return root
        if path.startswith(root + "/"):
            rest = path[len(root) + 1 :].split("/")
            out = [root, name]
            if len(rest) > 1:
                out.append(rest[1] if rest[1] in _STATEFUL_WORDS else "{path}")
            if len(rest) > 2:
                out.append("{id}")
            if len(rest) > 3:
                out.append("{path}")
            return "/".join(out)
    return None


class _Tree:
    """What every span of one request shares: trace id framing, root id, clock base."""

    __slots__ = (
        "backend",
        "ctx",
        "done",
        "head",
        "ids",
        "received",
        "root_id",
        "tail",
        "under_root",
        "usage",
        "wall",
    )

    def __init__(self, ctx: RequestContext, trace: TraceContext) -> None:
        t = ctx.timeline
        self.ctx = ctx
        self.received = t.received
        self.wall = t.wall_ns
        self.done = t.done if t.done is not None else t.received
        #: otlp.span_head inlined: trace id (field 1) + the span id's tag (field 2)
        self.head = b"\x0a\x10" + trace.id_bytes + b"\x12\x08"
        self.root_id = trace.root_span_id.to_bytes(8, "big")
        self.under_root = b"\x22\x08" + self.root_id
        self.tail = _TAIL
        #: the span ids of intake, auth, router, cache lookup, cache store: one random draw
        ids = _getrandbits(320).to_bytes(40, "big")
        while _ZERO_ID in ids:  # no id may be all zero (W3C); a false alarm only draws again
            ids = _getrandbits(320).to_bytes(40, "big")
        self.ids = ids
        #: gen_ai.usage.input_tokens / output_tokens: the same on the answering CLIENT span
        #: and the root, encoded once
        usage = ctx.answer.tokens
        tokens = b""
        if usage.input is not None:
            tokens = _i("gen_ai.usage.input_tokens", usage.input)
        if usage.output is not None:
            tokens += _i("gen_ai.usage.output_tokens", usage.output)
        self.usage = tokens
        self.backend = "memory"  # the cache's (the common tree's cache spans)

    def ns(self, t: float) -> int:
        return self.wall + int((t - self.received) * 1e9)


def build_spans(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    hop_base: int,
    cache_backend: str = "memory",
    auth_mode: str = "off",
) -> list[bytes]:
    """The encoded span tree of one finished request.

    Runs for every sampled request, so the common spans (intake, auth, router) are written
    inline here: one ``bytes.join`` each from memoised parts, the times packed by one struct
    call; the rarer ones have their own builders."""
    tree = _Tree(ctx, trace)
    head, under_root, wall, received = tree.head, tree.under_root, tree.wall, tree.received
    t = ctx.timeline
    spans = [_edge_span(tree, *hop) for hop in edge_hops] if edge_hops else []
    # hop intake: the gateway's own server, from the first byte read to the application
    intake_ns = wall + int((t.intake_done - received) * 1e9)
    key: tuple[Any, ...] = ("intake", hop_base + 1, "gateway")
    group = _GROUPS.get(key) or _group(key, _HOP_NAMES)
    times = _times(0x39, wall, 0x41, max(wall, intake_ns))
    ids = tree.ids
    spans.append(b"".join((head, ids[:8], under_root, _INTAKE, times, group, _TAIL)))
    # hop auth
    auth_done = t.auth_done
    auth_ns = wall + int(((auth_done if auth_done is not None else tree.done) - received) * 1e9)
    key = ("auth", hop_base + 2, "gateway", auth_mode)
    group = _GROUPS.get(key) or _group(key, _AUTH_NAMES)
    if ctx.tenant is not None:
        group += _s("gateway.tenant", ctx.tenant)
    times = _times(0x39, intake_ns, 0x41, max(intake_ns, auth_ns))
    spans.append(b"".join((head, ids[8:16], under_root, _AUTH, times, group, _TAIL)))
    if auth_done is not None:
        _router_spans(tree, hop_base + 3, cache_backend, spans, auth_ns)
    outcome = ctx.cache
    if outcome.store_start is not None:
        end = outcome.store_end or tree.done
        spans.append(
            _cache_span(tree, under_root, "cache store", outcome.store_start, end, cache_backend)
        )
    attempts = ctx.attempts
    if attempts:
        last = attempts[-1]
        spans.extend([_client_span(tree, attempt, attempt is last) for attempt in attempts])
    spans.append(_root_span(tree, trace, edge_hops))
    return spans


def _edge_span(tree: _Tree, name: str, index: int, start_s: float, end_s: float) -> bytes:
    return otlp.span_fast(
        tree.head,
        _sid(),
        tree.under_root,
        otlp.name_kind(f"hop {name}", otlp.KIND_INTERNAL),
        int(start_s * 1e9),
        int(end_s * 1e9),
        (_group((name, index, "header"), _HOP_NAMES),),
        tree.tail,
    )


def _router_spans(
    tree: _Tree, index: int, cache_backend: str, spans: list[bytes], start_ns: int
) -> None:
    """``hop router`` (and its ``cache lookup`` child), appended to ``spans``."""
    ctx = tree.ctx
    t = ctx.timeline
    call = ctx.call
    router_id = tree.ids[16:24]
    end = t.routed
    if end is None:
        end = ctx.attempts[0].start if ctx.attempts else tree.done
    end_ns = tree.wall + int((end - tree.received) * 1e9)
    route = call.route.name if call is not None else None
    key = ("router", index, "gateway", ctx.cache.result, route)
    attrs = [_GROUPS.get(key) or _group(key, _ROUTER_NAMES)]
    if t.body_received is not None:
        body_read = round((t.body_received - t.auth_done) * 1000, 3)  # type: ignore[operator]
        attrs.append(_F_BODY_READ + _double(body_read))
    if call is not None:
        attrs.append(_i("gateway.request.body_bytes", len(call.body)))
        if call.policies:
            attrs.extend([_a(f"gateway.{key}", value) for key, value in call.policies.items()])
    times = _times(0x39, start_ns, 0x41, max(start_ns, end_ns))
    spans.append(
        b"".join((tree.head, router_id, tree.under_root, _ROUTER, times, *attrs, tree.tail))
    )
    outcome = ctx.cache
    if outcome.lookup_start is not None:
        spans.append(
            _cache_span(
                tree,
                b"\x22\x08" + router_id,
                "cache lookup",
                outcome.lookup_start,
                outcome.lookup_end or tree.done,
                cache_backend,
            )
        )


#: (result, backend, error) -> the cache spans' fixed attributes
_CACHE_GROUPS: dict[tuple[str, str, bool], bytes] = {}


def _cache_group(result: str, backend: str, error: bool) -> bytes:
    attrs = [_s("gateway.cache", result), _s("gateway.cache.backend", backend)]
    if backend == "redis":
        attrs.append(_s("db.system.name", "redis"))
    if error:
        attrs.append(_s("error.type", "cache_unavailable"))
    got = _CACHE_GROUPS[(result, backend, error)] = b"".join(attrs)
    return got


_CACHE_LOOKUP = otlp.name_kind("cache lookup", otlp.KIND_INTERNAL)
_CACHE_STORE = otlp.name_kind("cache store", otlp.KIND_INTERNAL)
_ERROR_TAIL = otlp.tail(otlp.STATUS_ERROR, _FLAGS)


def _cache_span(
    tree: _Tree, parent: bytes, name: str, start: float, end: float, backend: str
) -> bytes:
    outcome = tree.ctx.cache
    key = (outcome.result, backend, outcome.error)
    group = _CACHE_GROUPS.get(key) or _cache_group(*key)
    store = name == "cache store"
    if outcome.stored is not None and store:
        group += _i("gateway.cache.entry_bytes", outcome.stored)
    start_ns = tree.wall + int((start - tree.received) * 1e9)
    end_ns = tree.wall + int((end - tree.received) * 1e9)
    return b"".join(
        (
            tree.head,
            tree.ids[32:] if store else tree.ids[24:32],
            parent,
            _CACHE_STORE if store else _CACHE_LOOKUP,
            _times(0x39, start_ns, 0x41, max(start_ns, end_ns)),
            group,
            _ERROR_TAIL if outcome.error else _TAIL,
        )
    )


def _client_span(tree: _Tree, attempt: Attempt, last: bool) -> bytes:
    """One CLIENT span per upstream attempt, GenAI semantic conventions (v1.41 names)."""
    ctx = tree.ctx
    if ctx.mcp is not None:
        return _mcp_span(tree, attempt, ctx.mcp)
    call = ctx.call
    b = attempt.backend
    model = ctx.model or ""
    operation = call.operation if call is not None else None
    max_tokens, temperature = _request_values(call.payload) if call is not None else _NO_VALUES
    key = (
        operation or "http",
        b.provider,
        model,
        call.stream if call is not None else False,
        b.host,
        b.port,
        b.name,
        attempt.number,
        attempt.status,
        max_tokens,
        temperature,
    )
    attrs = [_GROUPS.get(key) or _client_group(key)]
    if attempt.affinity is not None or attempt.load is not None:
        _fleet_attrs(attempt, attrs)
    status = otlp.STATUS_UNSET
    message = ""
    if attempt.status is not None and attempt.status >= 500:
        status = otlp.STATUS_ERROR
    if attempt.error is not None:
        status = otlp.STATUS_ERROR
        message = attempt.error.message
        attrs.append(_s("error.type", attempt.error.code or attempt.error.type))
    if last:
        attrs.extend(_answer_attrs(ctx, attempt, tree.usage))
        error = ctx.answer.error
        if error is not None and ctx.timeline.client_first_byte is not None:
            status = otlp.STATUS_ERROR  # the stream broke after the answer started
            message = error.message
            attrs.append(_s("error.type", error.code or error.type))
    end = attempt.end if attempt.end is not None else tree.done
    start_ns = tree.wall + int((attempt.start - tree.received) * 1e9)
    end_ns = tree.wall + int((end - tree.received) * 1e9)
    return b"".join(
        (
            tree.head,
            attempt.span_id.to_bytes(8, "big"),
            tree.under_root,
            otlp.name_kind(f"{operation or ctx.method} {model}".strip(), otlp.KIND_CLIENT),
            _times(0x39, start_ns, 0x41, max(start_ns, end_ns)),
            *attrs,
            _TAIL
            if status == otlp.STATUS_UNSET and not message
            else otlp.tail(status, _FLAGS, message),
        )
    )


def _mcp_attrs(mcp: dict[str, Any]) -> list[bytes]:
    """An MCP request's attributes (OpenTelemetry MCP and GenAI conventions; docs/spec.md §23)."""
    attrs = [_s("mcp.method.name", mcp.get("method") or "unknown")]
    attrs.append(_s("gateway.mcp.server", mcp.get("server") or "*"))
    if mcp.get("session"):
        attrs.append(_str("mcp.session.id", mcp["session"]))
    if mcp.get("id") is not None:
        attrs.append(_str("jsonrpc.request.id", str(mcp["id"])))
    if mcp.get("tool"):
        attrs.append(_s("gen_ai.tool.name", mcp["tool"]))
        attrs.append(_s("gen_ai.operation.name", "execute_tool"))
    if mcp.get("status") not in (None, "ok"):
        attrs.append(_s("error.type", mcp.get("error") or mcp["status"]))
    return attrs


def _mcp_span(tree: _Tree, attempt: Attempt, mcp: dict[str, Any]) -> bytes:
    """The CLIENT span of one JSON-RPC request to an MCP server: ``{method} {tool}``; its id
    went upstream as ``params._meta.traceparent``. A handshake the gateway made on its own
    (``/mcp`` opening a session upstream) is named by its own method."""
    b = attempt.backend
    method = mcp.get("methods", {}).get(attempt.span_id) or mcp.get("method") or "unknown"
    own = method != mcp.get("method")
    attrs = _mcp_attrs({**mcp, "method": method, "tool": None} if own else mcp)
    attrs.append(_s("server.address", b.host))
    attrs.append(_s("gateway.backend", b.name))
    if attempt.status is not None:
        attrs.append(_s("http.response.status_code", attempt.status))
    failed = attempt.error is not None or (not own and mcp.get("status") not in (None, "ok"))
    status = otlp.STATUS_ERROR if failed else otlp.STATUS_UNSET
    message = attempt.error.message if attempt.error is not None else ""
    tool = None if own else mcp.get("tool")
    end = attempt.end if attempt.end is not None else tree.done
    return otlp.span_fast(
        tree.head,
        attempt.span_id.to_bytes(8, "big"),
        tree.under_root,
        otlp.name_kind(f"{method} {tool or b.name}", otlp.KIND_CLIENT),
        tree.ns(attempt.start),
        tree.ns(end),
        attrs,
        otlp.tail(status, _FLAGS, message),
    )


_NO_VALUES: tuple[int | None, float | None] = (None, None)


def _fleet_attrs(attempt: Attempt, attrs: list[bytes]) -> None:
    if attempt.affinity is not None:  # docs/spec.md §21: a route with affinity
        attrs.append(_s("gateway.affinity", attempt.affinity))
    if attempt.load is not None:  # the backend's load as last scraped when it was chosen
        attrs.append(_f("gateway.backend.queue_depth", attempt.load[0]))
        if attempt.load[1] is not None:
            attrs.append(_f("gateway.backend.kv_cache_usage", attempt.load[1]))


def _request_values(payload: dict[str, Any]) -> tuple[int | None, float | None]:
    """``gen_ai.request.max_tokens`` and ``.temperature`` as the request gave them (or None)."""
    v = payload.get("max_tokens")
    if v is None:
        v = payload.get("max_completion_tokens", payload.get("max_output_tokens"))
    max_tokens = v if type(v) is int else None
    v = payload.get("temperature")
    return max_tokens, float(v) if type(v) is int or type(v) is float else None


def _client_group(key: tuple[Any, ...]) -> bytes:
    """The CLIENT span's stable attributes: the nine of :data:`_CLIENT_NAMES`, then the
    request's max_tokens and temperature (low-cardinality too), as one memoised block."""
    encoded = b"".join(_s(n, v) for n, v in zip(_CLIENT_NAMES, key, strict=False) if v is not None)
    max_tokens, temperature = key[-2:]
    if max_tokens is not None:
        encoded += _s("gen_ai.request.max_tokens", max_tokens)
    if temperature is not None:
        encoded += _f("gen_ai.request.temperature", temperature)
    return remember(_GROUPS, key, encoded, 4096)


def _answer_attrs(ctx: RequestContext, attempt: Attempt, usage: bytes) -> list[bytes]:
    """What the answering attempt got back: model, id, finish reasons, first chunk, usage."""
    answer = ctx.answer
    attrs = []
    if answer.response_model:
        attrs.append(_s("gen_ai.response.model", answer.response_model))
    if answer.response_id:
        attrs.append(_str("gen_ai.response.id", answer.response_id))
    if answer.finish_reasons:
        attrs.append(_finish_reasons(tuple(answer.finish_reasons)))
    first = ctx.timeline.first_content
    if first is not None:
        attrs.append(_f("gen_ai.response.time_to_first_chunk", round(first - attempt.start, 6)))
    if usage:
        attrs.append(usage)
    if answer.captured is not None:
        attrs.extend(_content_attrs(ctx))
    return attrs


_REASONS: dict[tuple[str, ...], bytes] = {}


def _finish_reasons(reasons: tuple[str, ...]) -> bytes:
    """``gen_ai.response.finish_reasons``, memoised: a handful of values ("stop", …)."""
    got = _REASONS.get(reasons)
    if got is None:
        got = _a("gen_ai.response.finish_reasons", list(reasons))
        got = remember(_REASONS, reasons, got, 256)
    return got


def _root_span(tree: _Tree, trace: TraceContext, edge_hops: list[EdgeHop]) -> bytes:
    """The SERVER root: from the first edge hop's start (or receipt) to the last byte."""
    ctx = tree.ctx
    request_s = tree.done - tree.received
    attrs = _root_attrs(tree, request_s)
    start_ns = tree.wall
    if edge_hops:
        start_ns = min(start_ns, int(edge_hops[0][2] * 1e9))
        attrs.append(_f("gateway.edge_time_ms", _ms(tree.wall / 1e9 - edge_hops[0][2])))
    answer = ctx.answer
    status = otlp.STATUS_ERROR if answer.status >= 500 else otlp.STATUS_UNSET
    message = ""
    error = answer.error
    if error is not None:
        attrs.append(_s("error.type", error.code or error.type))
        message = error.message
        if error.status >= 500:
            status = otlp.STATUS_ERROR
    if ctx.disconnected:
        attrs.append(_s("gateway.client_disconnected", True))
    if ctx.mcp is not None:
        attrs.extend(_mcp_attrs(ctx.mcp))
    if ctx.upload_bytes is not None:  # a streamed upload or download (docs/spec.md §24)
        attrs.append(_s("http.request.body.size", ctx.upload_bytes))
    if ctx.download_bytes is not None:
        attrs.append(_s("http.response.body.size", ctx.download_bytes))
    if ctx.object_call is not None:  # files.create, batches.retrieve, … (docs/spec.md §24)
        attrs.append(_s("gateway.object.operation", ctx.object_call[1]))
    parent_id = trace.parent_span_id
    if parent_id:
        flags = _FLAGS | otlp.FLAG_IS_REMOTE
        parent = b"\x22\x08" + parent_id.to_bytes(8, "big")
    else:
        flags = _FLAGS
        parent = b""
    head = tree.head
    if trace.trace_state:
        head = otlp.span_head(trace.trace_id.to_bytes(16, "big"), trace.trace_state)
    if status == otlp.STATUS_UNSET and not message and not parent_id:
        tail = _TAIL
    else:
        tail = otlp.tail(status, flags, message)
    end_ns = tree.wall + int(request_s * 1e9)
    return b"".join(
        (
            head,
            tree.root_id,
            parent,
            otlp.name_kind(f"{ctx.method} {route_template(ctx.path)}", otlp.KIND_SERVER),
            _times(0x39, start_ns, 0x41, max(start_ns, end_ns)),
            *attrs,
            tail,
        )
    )


def _root_attrs(tree: _Tree, request_s: float) -> list[bytes]:
    ctx = tree.ctx
    answer = ctx.answer
    call = ctx.call
    attempts = ctx.attempts
    done = tree.done
    if len(attempts) == 1:
        a = attempts[0]
        upstream_s = (a.end if a.end is not None else done) - a.start
    else:
        upstream_s = ctx.upstream_time(done)
    backoff = ctx.timeline.backoff
    path = ctx.path
    key = (
        ctx.method,
        path,
        ctx.scope.get("scheme", "http"),
        route_template(path),
        answer.status,
        ctx.client_address,
        ctx.cache.result,
        call.route.name if call is not None else None,
        ctx.model,
        ctx.tenant,
        len(attempts),
    )
    overhead = round(max(0.0, request_s - upstream_s - backoff) * 1000, 3)
    attrs = [
        _GROUPS.get(key) or _group(key, _ROOT_NAMES),
        _pack_root_times(
            _F_REQUEST,
            round(request_s * 1000, 3),
            _F_UPSTREAM,
            round(upstream_s * 1000, 3),
            _F_OVERHEAD,
            overhead,
        ),
        _str("gateway.request_id", ctx.request_id),
    ]
    if backoff:  # waited between attempts: neither upstream nor gateway time
        attrs.append(_f("gateway.backoff_ms", _ms(backoff)))
    if ctx.timeline.loop_lag is not None:  # how much of the times above was a busy loop
        attrs.append(_F_LAG + _double(round(ctx.timeline.loop_lag * 1000, 3)))
    first = ctx.timeline.first_content
    if first is not None:  # ctx.ttft()
        attrs.append(_f("gateway.ttft_ms", _ms(first - tree.received)))
    if tree.usage:
        attrs.append(tree.usage)
    usd = cost(ctx)  # docs/spec.md §20: from the same usage record
    if usd is not None:
        attrs.append(_f("gateway.cost_usd", usd))
    if ctx.edge_marks:
        attrs.append(_a("gateway.edge.discarded", [f"{k}:{v}" for k, v in ctx.edge_marks.items()]))
    return attrs


def _content_attrs(ctx: RequestContext) -> list[bytes]:
    """Prompts and completions, only with ``tracing.capture_content = true`` (docs/spec.md §7)."""
    out = []
    payload = ctx.call.payload if ctx.call is not None else {}
    prompt = payload.get("messages", payload.get("prompt", payload.get("input")))
    if prompt is not None:
        out.append(_a("gen_ai.input.messages", orjson.dumps(prompt).decode()))
    if ctx.answer.captured:
        out.append(_a("gen_ai.output.messages", "".join(ctx.answer.captured)))
    return out


# ---------------------------------------------------------------- the common tree, framed


#: ``ScopeSpans.spans`` framing (field 2) of a span of each length below 16384 bytes
_FRAME = tuple(b"\x12" + otlp.varint(n) for n in range(16384))
#: (hop base, auth mode, tenant) -> the fixed parts of the framed intake and auth spans
_LEADS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
#: (cache result, backend, error, store) -> the cache span's name and kind, attributes, tail
_CACHES: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}


def build_framed(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    hop_base: int,
    cache_backend: str = "memory",
    auth_mode: str = "off",
) -> tuple[bytes, int]:
    """The request's spans framed as ``ScopeSpans.spans`` entries, and their count: the bytes
    of ``otlp.frame_spans(build_spans(...))``.

    The common request (no edge hops, authenticated and routed, one attempt of a model call
    or none for a cache hit, no error, no parent, no MCP or stateful call) is written here in
    one pass from memoised parts, each span framed as it is written; any other goes through
    :func:`build_spans`."""
    t = ctx.timeline
    attempts = ctx.attempts
    call = ctx.call
    answer = ctx.answer
    if (
        edge_hops
        or call is None
        or len(attempts) != (0 if ctx.cache.result == "hit" else 1)
        or t.auth_done is None
        or trace.parent_span_id
        or trace.trace_state
        or answer.status >= 500
        or answer.error is not None
        or answer.captured is not None
        or ctx.mcp is not None
        or call.policies
        or _rare(ctx, attempts[0] if attempts else None)
    ):
        spans = build_spans(ctx, trace, edge_hops, hop_base, cache_backend, auth_mode)
        return otlp.frame_spans(spans), len(spans)
    tree = _Tree(ctx, trace)
    out = [_lead(tree, hop_base, auth_mode)]
    count = _cache_spans(tree, cache_backend, out)
    if attempts:
        out.append(_common_client(tree, attempts[0]))
        count += 1
    out.append(_common_root(tree))
    return b"".join(out), count + 4


def _rare(ctx: RequestContext, attempt: Attempt | None) -> bool:
    """What the common tree does not write: a retry wait, a failed attempt (an error, a 5xx),
    fleet attributes, a disconnect, an edge's discarded headers, a stateful call."""
    return bool(
        ctx.timeline.backoff
        or (
            attempt is not None
            and (
                attempt.error is not None
                or (attempt.status is not None and attempt.status >= 500)
                or attempt.affinity is not None
                or attempt.load is not None
            )
        )
        or ctx.disconnected
        or ctx.edge_marks
        or ctx.object_call is not None
        or ctx.upload_bytes is not None
        or ctx.download_bytes is not None
    )


def _framed(span: bytes) -> bytes:
    n = len(span)
    return (_FRAME[n] if n < 16384 else b"\x12" + otlp.varint(n)) + span


def _lead(tree: _Tree, hop_base: int, auth_mode: str) -> bytes:
    """``hop intake``, ``hop auth`` and ``hop router``, framed, by one struct call: their
    lengths are fixed per (hop base, auth mode, tenant, cache result, route, whether the body
    read is timed, the body size's varint length), so all but ids, times and the two numbers
    is memoised."""
    ctx = tree.ctx
    t = ctx.timeline
    call = ctx.call
    assert call is not None and t.auth_done is not None
    size = len(call.body)
    body_read = t.body_received
    key = (
        hop_base,
        auth_mode,
        ctx.tenant,
        ctx.cache.result,
        call.route.name,
        body_read is not None,
        (size.bit_length() + 6) // 7,  # the body size's varint length (0 for 0)
    )
    pack, c0, c1, c2, c3, c4, c5, c6, c7 = _LEADS.get(key) or _lead_parts(key)
    wall, received, auth_done = tree.wall, tree.received, t.auth_done
    intake_ns = wall + int((t.intake_done - received) * 1e9)
    auth_ns = wall + int((auth_done - received) * 1e9)
    end = t.routed
    if end is None:
        end = ctx.attempts[0].start if ctx.attempts else tree.done
    end_ns = wall + int((end - received) * 1e9)
    head, under_root, ids = tree.head, tree.under_root, tree.ids
    size_bytes = _SMALL_VARINT[size] if size < 16384 else otlp.varint(size)
    if body_read is None:
        return pack(  # type: ignore[no-any-return]
            c0, head, ids[:8], under_root, c1, wall, b"\x41", max(wall, intake_ns),
            c2, head, ids[8:16], under_root, c3, intake_ns, b"\x41", max(intake_ns, auth_ns),
            c4, head, ids[16:24], under_root, c5, auth_ns, b"\x41", max(auth_ns, end_ns),
            c6, c7, size_bytes, _TAIL,
        )  # fmt: skip
    return pack(  # type: ignore[no-any-return]
        c0, head, ids[:8], under_root, c1, wall, b"\x41", max(wall, intake_ns),
        c2, head, ids[8:16], under_root, c3, intake_ns, b"\x41", max(intake_ns, auth_ns),
        c4, head, ids[16:24], under_root, c5, auth_ns, b"\x41", max(auth_ns, end_ns),
        c6, round((body_read - auth_done) * 1000, 3), c7, size_bytes, _TAIL,
    )  # fmt: skip


_SMALL_VARINT = tuple(otlp.varint(n) for n in range(16384))


def _lead_parts(key: tuple[Any, ...]) -> tuple[Any, ...]:
    hop_base, auth_mode, tenant, result, route, body_read, size_len = key
    intake = _group(("intake", hop_base + 1, "gateway"), _HOP_NAMES) + _TAIL
    auth = _group(("auth", hop_base + 2, "gateway", auth_mode), _AUTH_NAMES)
    if tenant is not None:
        auth += _s("gateway.tenant", tenant)
    auth += _TAIL
    router = _group(("router", hop_base + 3, "gateway", result, route), _ROUTER_NAMES)
    if body_read:
        router += _F_BODY_READ  # + its 8 value bytes
    size_len = max(1, size_len)  # the body size's varint: 7 bits a byte
    # gateway.request.body_bytes: its framing is fixed by the length of its varint
    sizes = _i("gateway.request.body_bytes", 1 << (7 * (size_len - 1)))
    body_bytes = sizes[:-size_len]
    # a span is: trace id framed (20 bytes), span id (8), parent framed (10), name and kind,
    # start and end (18), attributes and tail
    n_intake = 56 + len(_INTAKE) + len(intake)
    n_auth = 56 + len(_AUTH) + len(auth)
    n_router = 56 + len(_ROUTER) + len(router) + 8 * body_read + len(sizes) + len(_TAIL)
    c0, c1 = _FRAME[n_intake], _INTAKE + b"\x39"
    c2, c3 = intake + _FRAME[n_auth], _AUTH + b"\x39"
    c4, c5 = auth + _FRAME[n_router], _ROUTER + b"\x39"
    c6, c7 = router, body_bytes
    fmt = (
        f"<{len(c0)}s20s8s10s{len(c1)}sQsQ{len(c2)}s20s8s10s{len(c3)}sQsQ"
        f"{len(c4)}s20s8s10s{len(c5)}sQsQ{len(c6)}s{'d' if body_read else ''}"
        f"{len(c7)}s{size_len}s{len(_TAIL)}s"
    )
    parts = (struct.Struct(fmt).pack, c0, c1, c2, c3, c4, c5, c6, c7)
    return remember(_LEADS, key, parts, 1024)


#: (cache result, backend, error, store, gateway.cache.entry_bytes' length) -> a struct packing
#: the whole framed cache span and its constant parts (issue 32)
_CACHE_PACKS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _cache_spans(tree: _Tree, cache_backend: str, out: list[bytes]) -> int:
    """``cache lookup`` (under the router) and ``cache store``, framed (the bytes of
    :func:`_cache_span`), appended to ``out``; how many spans that is. Each is one memoised
    struct call: only ids, times and the entry size are per request."""
    outcome = tree.ctx.cache
    tree.backend = cache_backend
    lookup_start, store_start = outcome.lookup_start, outcome.store_start
    if lookup_start is None and store_start is None:
        return 0
    wall, received, head, ids = tree.wall, tree.received, tree.head, tree.ids
    count = 0
    if lookup_start is not None:
        key: tuple[Any, ...] = (outcome.result, cache_backend, outcome.error, False, 0)
        pack, c0, c1, c2, c3 = _CACHE_PACKS.get(key) or _cache_parts(key)
        end = outcome.lookup_end or tree.done
        start_ns = wall + int((lookup_start - received) * 1e9)
        end_ns = wall + int((end - received) * 1e9)
        out.append(
            pack(c0, head, ids[24:32], b"\x22\x08" + ids[16:24], c1, start_ns, 0x41,
                 max(start_ns, end_ns), c2, b"", c3)
        )  # fmt: skip
        count = 1
    if store_start is not None:
        stored = outcome.stored
        entry = b"" if stored is None else _i("gateway.cache.entry_bytes", stored)
        key = (outcome.result, cache_backend, outcome.error, True, len(entry))
        pack, c0, c1, c2, c3 = _CACHE_PACKS.get(key) or _cache_parts(key)
        end = outcome.store_end or tree.done
        start_ns = wall + int((store_start - received) * 1e9)
        end_ns = wall + int((end - received) * 1e9)
        out.append(
            pack(c0, head, ids[32:], tree.under_root, c1, start_ns, 0x41,
                 max(start_ns, end_ns), c2, entry, c3)
        )  # fmt: skip
        count += 1
    return count


def _cache_parts(key: tuple[Any, ...]) -> tuple[Any, ...]:
    result, backend, error, store, entry_len = key
    group = _CACHE_GROUPS.get(key[:3]) or _cache_group(result, backend, error)
    name = (_CACHE_STORE if store else _CACHE_LOOKUP) + b"\x39"
    tail = _ERROR_TAIL if error else _TAIL
    # trace id framed (20 bytes), span id (8), parent framed (10), name and kind, the start's
    # 8 bytes, the end framed (9), attributes and tail
    n = 20 + 8 + 10 + len(name) + 8 + 9 + len(group) + entry_len + len(tail)
    c0 = _FRAME[n] if n < 16384 else b"\x12" + otlp.varint(n)
    fmt = f"<{len(c0)}s20s8s10s{len(name)}sQBQ{len(group)}s{entry_len}s{len(tail)}s"
    parts = (struct.Struct(fmt).pack, c0, name, group, tail)
    return remember(_CACHE_PACKS, key, parts, 256)


def _cache_framed(
    tree: _Tree, span_id: bytes, parent: bytes, start: float, end: float, store: bool = False
) -> bytes:
    """``cache lookup`` or ``cache store`` (the bytes of :func:`_cache_span`), framed."""
    outcome = tree.ctx.cache
    key = (outcome.result, tree.backend, outcome.error, store)
    got = _CACHES.get(key)
    if got is None:
        group = _CACHE_GROUPS.get(key[:3]) or _cache_group(*key[:3])
        got = (_CACHE_STORE if store else _CACHE_LOOKUP, group)
        got = remember(_CACHES, key, got, 256)
    name, group = got
    if store and outcome.stored is not None:
        group += _i("gateway.cache.entry_bytes", outcome.stored)
    wall, received = tree.wall, tree.received
    start_ns = wall + int((start - received) * 1e9)
    end_ns = wall + int((end - received) * 1e9)
    span = b"".join(
        (
            tree.head,
            span_id,
            parent,
            name,
            _times(0x39, start_ns, 0x41, max(start_ns, end_ns)),
            group,
            _ERROR_TAIL if outcome.error else _TAIL,
        )
    )
    return _FRAME[len(span)] + span


#: the CLIENT span's key (see :func:`_client_span`) + the answer's model and finish reasons and
#: the lengths of its response id and token counts, whether it has a first chunk -> a struct
#: packing the whole framed span and its constant parts
_CLIENTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _common_client(tree: _Tree, attempt: Attempt) -> bytes:
    """The answering attempt's CLIENT span (the bytes of :func:`_client_span` for an attempt
    without error or fleet attributes), framed: one memoised struct call per request shape."""
    ctx = tree.ctx
    call = ctx.call
    assert call is not None
    b = attempt.backend
    answer = ctx.answer
    max_tokens, temperature = _request_values(call.payload)
    reasons = answer.finish_reasons
    response_id = answer.response_id
    rid = response_id.encode("utf-8", "surrogatepass") if response_id else b""
    first = ctx.timeline.first_content
    usage = tree.usage
    key = (
        call.operation or "http",
        b.provider,
        ctx.model or "",
        call.stream,
        b.host,
        b.port,
        b.name,
        attempt.number,
        attempt.status,
        max_tokens,
        temperature,
        answer.response_model,
        tuple(reasons) if reasons else None,
        ctx.method if call.operation is None else None,
        len(rid) if response_id else -1,
        first is not None,
        len(usage),
    )
    pack, c0, c1, c2, c3 = _CLIENTS.get(key) or _client_parts(key)
    wall, received = tree.wall, tree.received
    end = attempt.end if attempt.end is not None else tree.done
    start_ns = wall + int((attempt.start - received) * 1e9)
    end_ns = wall + int((end - received) * 1e9)
    span_id = attempt.span_id.to_bytes(8, "big")
    if first is None:
        return pack(  # type: ignore[no-any-return]
            c0, tree.head, span_id, tree.under_root, c1, start_ns, b"\x41",
            max(start_ns, end_ns), c2, rid, c3, usage, _TAIL,
        )  # fmt: skip
    return pack(  # type: ignore[no-any-return]
        c0, tree.head, span_id, tree.under_root, c1, start_ns, b"\x41",
        max(start_ns, end_ns), c2, rid, c3, round(first - attempt.start, 6), usage, _TAIL,
    )  # fmt: skip


_F_TTFC: Final = otlp.float_prefix("gen_ai.response.time_to_first_chunk")


def _client_parts(key: tuple[Any, ...]) -> tuple[Any, ...]:
    group = _GROUPS.get(key[:11]) or _client_group(key[:11])
    model, response_model, reasons, method = key[2], key[11], key[12], key[13]
    id_len, first, usage_len = key[14:]
    if response_model:
        group += _s("gen_ai.response.model", response_model)
    if id_len >= 0:  # gen_ai.response.id's framing depends only on its value's length
        group += _str("gen_ai.response.id", "a" * id_len)[: -id_len or None]
    after_id = _finish_reasons(reasons) if reasons else b""
    if first:
        after_id += _F_TTFC  # + its 8 value bytes
    name = otlp.name_kind(f"{method or key[0]} {model}".strip(), otlp.KIND_CLIENT) + b"\x39"
    id_len = max(id_len, 0)
    n = 56 - 1 + len(name) + len(group) + id_len + len(after_id) + 8 * first + usage_len
    c0 = _FRAME[n + len(_TAIL)] if n + len(_TAIL) < 16384 else b"\x12" + otlp.varint(n + len(_TAIL))
    fmt = (
        f"<{len(c0)}s20s8s10s{len(name)}sQsQ{len(group)}s{id_len}s{len(after_id)}s"
        f"{'d' if first else ''}{usage_len}s{len(_TAIL)}s"
    )
    parts = (struct.Struct(fmt).pack, c0, name, group, after_id)
    return remember(_CLIENTS, key, parts, 4096)


#: the root's stable attributes' key -> (a struct packing its name to the overhead, its parts)
_ROOTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _common_root(tree: _Tree) -> bytes:
    """The SERVER root of the common tree (the bytes of :func:`_root_span` without a parent,
    edge hops, error or retry wait), framed; name, times, stable attributes, the three times,
    the request id and the loop lag are one memoised struct call."""
    ctx = tree.ctx
    call = ctx.call
    assert call is not None
    attempts = ctx.attempts
    t = ctx.timeline
    done = tree.done
    request_s = done - tree.received
    if attempts:
        a = attempts[0]
        upstream_s = (a.end if a.end is not None else done) - a.start
    else:  # a cache hit
        upstream_s = 0.0
    request_id = ctx.request_id.encode("utf-8", "surrogatepass")
    lag = t.loop_lag
    key = (
        ctx.method,
        ctx.path,
        ctx.scope.get("scheme", "http"),
        ctx.answer.status,
        ctx.client_address,
        ctx.cache.result,
        call.route.name,
        ctx.model,
        ctx.tenant,
        len(request_id),
        lag is not None,
        len(attempts),
    )
    pack, c0, c1, c2, c3, c4 = _ROOTS.get(key) or _root_parts(key)
    wall = tree.wall
    end_ns = wall + int(request_s * 1e9)
    request_ms = round(request_s * 1000, 3)
    upstream_ms = round(upstream_s * 1000, 3)
    overhead_ms = round(max(0.0, request_s - upstream_s) * 1000, 3)
    parts = [tree.head, tree.root_id]
    if lag is None:
        parts.append(
            pack(c0, wall, b"\x41", max(wall, end_ns), c1, request_ms, c2, upstream_ms, c3,
                 overhead_ms, c4, request_id)
        )  # fmt: skip
    else:
        parts.append(
            pack(c0, wall, b"\x41", max(wall, end_ns), c1, request_ms, c2, upstream_ms, c3,
                 overhead_ms, c4, request_id, _F_LAG, round(lag * 1000, 3))
        )  # fmt: skip
    first = t.first_content
    if first is not None:
        parts.append(_f("gateway.ttft_ms", _ms(first - tree.received)))
    parts.append(tree.usage)
    usd = cost(ctx)
    if usd is not None:
        parts.append(_f("gateway.cost_usd", usd))
    parts.append(_TAIL)
    span = b"".join(parts)
    return _FRAME[len(span)] + span if len(span) < 16384 else _framed(span)


def _root_parts(key: tuple[Any, ...]) -> tuple[Any, ...]:
    method, path, scheme, status, client, result, route, model, tenant, id_bytes, lag, n = key
    template = route_template(path)
    stable = (method, path, scheme, template, status, client, result, route, model, tenant, n)
    group = _GROUPS.get(stable) or _group(stable, _ROOT_NAMES)
    c0 = otlp.name_kind(f"{method} {template}", otlp.KIND_SERVER) + b"\x39"
    c1 = group + _F_REQUEST
    # gateway.request_id's framing depends only on the length of its value
    c4 = _str("gateway.request_id", "a" * id_bytes)[: -id_bytes or None]
    fmt = f"<{len(c0)}sQsQ{len(c1)}sd{len(_F_UPSTREAM)}sd{len(_F_OVERHEAD)}sd{len(c4)}s{id_bytes}s"
    if lag:
        fmt += f"{len(_F_LAG)}sd"
    parts = (struct.Struct(fmt).pack, c0, c1, _F_UPSTREAM, _F_OVERHEAD, c4)
    return remember(_ROOTS, key, parts, 4096)
