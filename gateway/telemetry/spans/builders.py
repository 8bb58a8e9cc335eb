"""The general span writer: one builder per span kind, for any request (edge hops, retries,
errors, a remote parent, MCP, stateful calls). The common request takes the framed fast path
(:mod:`~gateway.telemetry.spans.framed`), which writes the same bytes."""

from __future__ import annotations

from typing import Any

from gateway.context import Attempt, RequestContext, TraceContext
from gateway.telemetry import otlp
from gateway.telemetry.spans.conventions import (
    GENAI,
    SpanStyle,
    content_attrs,
    llm_attrs,
    root_attrs,
    tool_attrs,
)
from gateway.telemetry.spans.route_names import route_template
from gateway.telemetry.spans.tree import (
    _AUTH,
    _AUTH_NAMES,
    _CACHE_GROUPS,
    _CACHE_LOOKUP,
    _CACHE_STORE,
    _ERROR_TAIL,
    _F_BODY_READ,
    _F_LAG,
    _F_OVERHEAD,
    _F_REQUEST,
    _F_UPSTREAM,
    _FLAGS,
    _GROUPS,
    _HOP_NAMES,
    _INTAKE,
    _ROOT_NAMES,
    _ROUTER,
    _ROUTER_NAMES,
    _TAIL,
    EdgeHop,
    _a,
    _cache_group,
    _client_group,
    _double,
    _f,
    _finish_reasons,
    _group,
    _i,
    _ms,
    _pack_root_times,
    _request_values,
    _s,
    _sid,
    _str,
    _times,
    _Tree,
)


def build_spans(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    hop_base: int,
    cache_backend: str = "memory",
    auth_mode: str = "off",
    style: SpanStyle = GENAI,
) -> list[bytes]:
    """The encoded span tree of one finished request.

    Runs for every sampled request, so the common spans (intake, auth, router) are written
    inline here: one ``bytes.join`` each from memoised parts, the times packed by one struct
    call; the rarer ones have their own builders. ``style``: the naming conventions and the
    content policy (docs/spec.md §7)."""
    tree = _Tree(ctx, trace, style)
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
    if ctx.mcp is not None or ctx.a2a is not None:  # an MCP exchange, an A2A call
        return _exchange_span(tree, attempt)
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
    if tree.style.openinference:
        attrs.extend(llm_attrs(ctx, attempt, last))
    status = otlp.STATUS_UNSET
    message = ""
    if attempt.status is not None and attempt.status >= 500:
        status = otlp.STATUS_ERROR
    if attempt.error is not None:
        status = otlp.STATUS_ERROR
        message = attempt.error.message
        attrs.append(_s("error.type", attempt.error.code or attempt.error.type))
    if last:
        attrs.extend(_answer_attrs(tree, attempt))
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


def _exchange_span(tree: _Tree, attempt: Attempt) -> bytes:
    """The CLIENT span of an MCP exchange or an A2A call."""
    ctx = tree.ctx
    if ctx.mcp is not None:
        return _mcp_span(tree, attempt, ctx.mcp)
    return _a2a_span(tree, attempt, ctx.a2a or {})


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
    version = mcp.get("protocol")
    if isinstance(version, str) and version:
        attrs.append(_s("mcp.protocol.version", version))
    attrs.append(_MCP_TRANSPORT)
    status = mcp.get("status")
    if status not in _MCP_FINE:
        attrs.append(_s("error.type", mcp.get("error") or status))
        if status == "error":  # the JSON-RPC error's code (MCP conventions)
            attrs.append(_s("rpc.response.status_code", str(mcp.get("error"))))
    return attrs


#: MCP statuses that are no failure: an answer, and a GET stream the server does not offer
_MCP_FINE = (None, "ok", "no_stream")
#: Streamable HTTP: HTTP over TCP (MCP conventions: network.protocol.name, network.transport)
_MCP_TRANSPORT = _s("network.protocol.name", "http") + _s("network.transport", "tcp")


def _mcp_span(tree: _Tree, attempt: Attempt, mcp: dict[str, Any]) -> bytes:
    """The CLIENT span of one JSON-RPC request to an MCP server: ``{method} {tool}``; its id
    went upstream as ``params._meta.traceparent``. A handshake the gateway made on its own
    (``/mcp`` opening a session upstream) is named by its own method."""
    b = attempt.backend
    method = mcp.get("methods", {}).get(attempt.span_id) or mcp.get("method") or "unknown"
    own = method != mcp.get("method")
    attrs = _mcp_attrs({**mcp, "method": method, "tool": None} if own else mcp)
    attrs.append(_s("server.address", b.host))
    attrs.append(_s("server.port", b.port))
    attrs.append(_s("gateway.backend", b.name))
    if attempt.status is not None:
        attrs.append(_s("http.response.status_code", attempt.status))
    if tree.style.openinference:
        attrs.extend(tool_attrs(mcp, own))
    failed = attempt.error is not None or (not own and mcp.get("status") not in _MCP_FINE)
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


def _a2a_attrs(a2a: dict[str, Any]) -> list[bytes]:
    """An A2A call's attributes (the OpenTelemetry A2A and GenAI names; docs/spec.md §30)."""
    method = a2a.get("method") or "unknown"
    attrs = [_s("a2a.method.name", method), _s("gateway.a2a.agent", a2a.get("agent") or "*")]
    if a2a.get("task"):
        attrs.append(_str("a2a.task.id", a2a["task"]))
    if a2a.get("state"):
        attrs.append(_s("a2a.task.state", a2a["state"]))
    if a2a.get("context"):
        attrs.append(_str("gen_ai.conversation.id", a2a["context"]))
    if a2a.get("id") is not None:
        attrs.append(_str("jsonrpc.request.id", str(a2a["id"])))
    if method in _A2A_INVOKE:
        attrs.append(_s("gen_ai.operation.name", "invoke_agent"))
        attrs.append(_s("gen_ai.agent.name", a2a.get("agent") or "*"))
    if a2a.get("status") not in (None, "ok"):
        attrs.append(_s("error.type", a2a.get("error") or a2a["status"]))
    return attrs


#: the methods that hand an agent a message (GenAI's ``invoke_agent`` operation)
_A2A_INVOKE = frozenset({"SendMessage", "SendStreamingMessage", "message/send", "message/stream"})


def _a2a_span(tree: _Tree, attempt: Attempt, a2a: dict[str, Any]) -> bytes:
    """The CLIENT span of one call to an agent: ``{method} {agent}``; its id went to the agent
    as ``traceparent``."""
    b = attempt.backend
    attrs = _a2a_attrs(a2a)
    attrs.append(_s("server.address", b.host))
    attrs.append(_s("gateway.backend", b.name))
    if attempt.status is not None:
        attrs.append(_s("http.response.status_code", attempt.status))
    failed = attempt.error is not None or a2a.get("status") not in (None, "ok")
    status = otlp.STATUS_ERROR if failed else otlp.STATUS_UNSET
    message = attempt.error.message if attempt.error is not None else ""
    end = attempt.end if attempt.end is not None else tree.done
    return otlp.span_fast(
        tree.head,
        attempt.span_id.to_bytes(8, "big"),
        tree.under_root,
        otlp.name_kind(f"{a2a.get('method') or 'unknown'} {b.name}", otlp.KIND_CLIENT),
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


def _answer_attrs(tree: _Tree, attempt: Attempt) -> list[bytes]:
    """What the answering attempt got back: model, id, finish reasons, first chunk, usage and
    cost, and the content when ``capture_content`` is on."""
    ctx = tree.ctx
    usage = tree.usage
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
    content = tree.style.content
    if answer.captured is not None and content.capturing:
        attrs.extend(content_attrs(ctx, content))
    return attrs


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
    _rarer_root_attrs(tree, trace, attrs)
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


def _rarer_root_attrs(tree: _Tree, trace: TraceContext, attrs: list[bytes]) -> None:
    """What only some roots carry: an MCP request's or an A2A call's facts, OpenInference's kind,
    a link, a stateful call's bytes and operation."""
    ctx = tree.ctx
    if ctx.mcp is not None or ctx.a2a is not None:  # an MCP request, an A2A call
        attrs.extend(_mcp_attrs(ctx.mcp) if ctx.mcp is not None else _a2a_attrs(ctx.a2a or {}))
    if tree.style.openinference:
        attrs.extend(root_attrs(ctx))
    if trace.link is not None:  # the request's other context (docs/spec.md §23)
        link_trace, link_span, link_state = trace.link
        attrs.append(
            otlp.link(
                link_trace.to_bytes(16, "big"),
                link_span.to_bytes(8, "big"),
                link_state,
                _FLAGS | otlp.FLAG_IS_REMOTE,
            )
        )
    if ctx.upload_bytes is not None:  # a streamed upload or download (docs/spec.md §24)
        attrs.append(_s("http.request.body.size", ctx.upload_bytes))
    if ctx.download_bytes is not None:
        attrs.append(_s("http.response.body.size", ctx.download_bytes))
    if ctx.object_call is not None:  # files.create, batches.retrieve, … (docs/spec.md §24)
        attrs.append(_s("gateway.object.operation", ctx.object_call[1]))


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
        ctx.scope.get("http_version", "1.1"),
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
    if tree.usage:  # usage and cost (docs/spec.md §20: from the same usage record)
        attrs.append(tree.usage)
    if ctx.edge_marks:
        attrs.append(_a("gateway.edge.discarded", [f"{k}:{v}" for k, v in ctx.edge_marks.items()]))
    return attrs
