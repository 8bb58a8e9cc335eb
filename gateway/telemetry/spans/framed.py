"""The common request's span tree, framed: the bytes of ``otlp.frame_spans(build_spans(...))``
written in one pass from memoised ``struct`` templates, each span framed as it is written.

The common request: no edge hops, authenticated and routed, one attempt of a model call or
none for a cache hit, no error, no parent, no MCP or stateful call. Any other request goes
through :func:`~gateway.telemetry.spans.builders.build_spans`; tests/telemetry/test_common_tree.py
holds the two to the same bytes with the same ids."""

from __future__ import annotations

import struct
from typing import Any, Final

from gateway.context import Attempt, RequestContext, TraceContext
from gateway.memo import remember
from gateway.telemetry import otlp
from gateway.telemetry.spans.builders import build_spans
from gateway.telemetry.spans.conventions import GENAI, SpanStyle
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
    _GROUPS,
    _HOP_NAMES,
    _INTAKE,
    _ROOT_NAMES,
    _ROUTER,
    _ROUTER_NAMES,
    _TAIL,
    EdgeHop,
    _cache_group,
    _client_group,
    _f,
    _finish_reasons,
    _group,
    _i,
    _ms,
    _request_values,
    _s,
    _str,
    _Tree,
)

#: ``ScopeSpans.spans`` framing (field 2) of a span of each length below 16384 bytes
_FRAME = tuple(b"\x12" + otlp.varint(n) for n in range(16384))
#: the key of :func:`_lead` -> its struct's pack and the framed spans' constant parts
_LEADS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def build_framed(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    hop_base: int,
    cache_backend: str = "memory",
    auth_mode: str = "off",
    style: SpanStyle = GENAI,
) -> tuple[bytes, int]:
    """The request's spans framed as ``ScopeSpans.spans`` entries, and their count: the bytes
    of ``otlp.frame_spans(build_spans(...))``.

    The common request (no edge hops, authenticated and routed, one attempt of a model call
    or none for a cache hit, no error, no parent, no MCP or stateful call) is written here in
    one pass from memoised parts, each span framed as it is written; any other goes through
    :func:`build_spans`, and so does every request when ``style`` asks for OpenInference's
    names or captured content (``answer.captured`` is set then)."""
    if not is_common(ctx, trace, edge_hops, style):
        spans = build_spans(ctx, trace, edge_hops, hop_base, cache_backend, auth_mode, style)
        return otlp.frame_spans(spans), len(spans)
    return common_tree(ctx, trace, hop_base, cache_backend, auth_mode)


def is_common(
    ctx: RequestContext, trace: TraceContext, edge_hops: list[EdgeHop], style: SpanStyle
) -> bool:
    """Whether the request's tree is the common one :func:`common_tree` writes."""
    call = ctx.call
    answer = ctx.answer
    attempts = ctx.attempts
    return not (
        edge_hops
        or call is None
        or len(attempts) != (0 if ctx.cache.result == "hit" else 1)
        or ctx.timeline.auth_done is None
        or trace.parent_span_id
        or trace.trace_state
        or answer.status >= 500
        or answer.error is not None
        or answer.captured is not None
        or style.openinference
        or ctx.mcp is not None
        or call.policies
        or _rare(ctx, attempts[0] if attempts else None)
    )


def common_tree(
    ctx: RequestContext, trace: TraceContext, hop_base: int, cache_backend: str, auth_mode: str
) -> tuple[bytes, int]:
    """The common request's spans (:func:`is_common`), framed, and their count."""
    attempts = ctx.attempts
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
#: the whole framed cache span and its constant parts
_CACHE_PACKS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _cache_spans(tree: _Tree, cache_backend: str, out: list[bytes]) -> int:
    """``cache lookup`` (under the router) and ``cache store``, framed (the bytes of
    :func:`_cache_span`), appended to ``out``; how many spans that is. Each is one memoised
    struct call: only ids, times and the entry size are per request."""
    outcome = tree.ctx.cache
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
        ctx.scope.get("http_version", "1.1"),
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
    parts.append(tree.usage)  # with the cost
    parts.append(_TAIL)
    span = b"".join(parts)
    return _FRAME[len(span)] + span if len(span) < 16384 else _framed(span)


def _root_parts(key: tuple[Any, ...]) -> tuple[Any, ...]:
    method, path, scheme, version, status, client, result, route, model, tenant, ids, lag, n = key
    template = route_template(path)
    stable = (
        method, path, scheme, version, template, status, client, result, route, model, tenant, n
    )  # fmt: skip
    group = _GROUPS.get(stable) or _group(stable, _ROOT_NAMES)
    c0 = otlp.name_kind(f"{method} {template}", otlp.KIND_SERVER) + b"\x39"
    c1 = group + _F_REQUEST
    # gateway.request_id's framing depends only on the length of its value
    c4 = _str("gateway.request_id", "a" * ids)[: -ids or None]
    fmt = f"<{len(c0)}sQsQ{len(c1)}sd{len(_F_UPSTREAM)}sd{len(_F_OVERHEAD)}sd{len(c4)}s{ids}s"
    if lag:
        fmt += f"{len(_F_LAG)}sd"
    parts = (struct.Struct(fmt).pack, c0, c1, _F_UPSTREAM, _F_OVERHEAD, c4)
    return remember(_ROOTS, key, parts, 4096)
