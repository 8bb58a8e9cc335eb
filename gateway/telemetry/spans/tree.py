"""What every span of one request shares (:class:`_Tree`: trace id framing, root id, clock
base, the random span ids) and the memoised attribute blocks both span writers use
(:mod:`~gateway.telemetry.spans.builders` and :mod:`~gateway.telemetry.spans.framed`): only
times, ids and numbers are encoded per request."""

from __future__ import annotations

import random
import struct
from typing import Any, Final

from gateway.budgets.spend import cost
from gateway.context import RequestContext, TraceContext
from gateway.memo import remember
from gateway.telemetry import otlp
from gateway.telemetry.spans.conventions import GENAI, SpanStyle

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
    "network.protocol.version",
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


class _Tree:
    """What every span of one request shares: trace id framing, root id, clock base."""

    __slots__ = (
        "ctx",
        "done",
        "head",
        "ids",
        "received",
        "root_id",
        "style",
        "tail",
        "under_root",
        "usage",
        "wall",
    )

    def __init__(self, ctx: RequestContext, trace: TraceContext, style: SpanStyle = GENAI) -> None:
        t = ctx.timeline
        self.ctx = ctx
        self.style = style
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
        self.usage = _answer_block(ctx)

    def ns(self, t: float) -> int:
        return self.wall + int((t - self.received) * 1e9)


def _answer_block(ctx: RequestContext) -> bytes:
    """What the answer came to, the same on the answering CLIENT span and the root, encoded
    once: ``gen_ai.conversation.id``, the usage (GenAI conventions: input and output, the
    cache reads and writes within the input, the reasoning within the output; the parts only
    when reported) and ``gateway.cost_usd`` (docs/spec.md §7, §20)."""
    block = b""
    conversation = ctx.conversation_id
    if conversation is not None:
        block = _str("gen_ai.conversation.id", conversation)
    usage = ctx.answer.tokens
    if usage.input is not None:
        block += _i("gen_ai.usage.input_tokens", usage.input)
    if usage.output is not None:
        block += _i("gen_ai.usage.output_tokens", usage.output)
    if usage.cached_input:
        block += _i("gen_ai.usage.cache_read.input_tokens", usage.cached_input)
    if usage.cache_write:
        block += _i("gen_ai.usage.cache_creation.input_tokens", usage.cache_write)
    if usage.reasoning:
        block += _i("gen_ai.usage.reasoning.output_tokens", usage.reasoning)
    usd = cost(ctx)
    if usd is not None:
        block += _f("gateway.cost_usd", usd)
    return block


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


_REASONS: dict[tuple[str, ...], bytes] = {}


def _finish_reasons(reasons: tuple[str, ...]) -> bytes:
    """``gen_ai.response.finish_reasons``, memoised: a handful of values ("stop", …)."""
    got = _REASONS.get(reasons)
    if got is None:
        got = _a("gen_ai.response.finish_reasons", list(reasons))
        got = remember(_REASONS, reasons, got, 256)
    return got
