"""The edge hop: trust, proxy header hygiene, request id, edge timing headers, body intake.

Forwarding and timing headers count only from peers in ``edge.trusted_proxies``
(docs/architecture.md, habit 9, after uvicorn's ``ProxyHeadersMiddleware``). Hop-by-hop headers
(RFC 9110 §7.6.1) never cross the gateway in either direction.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import AsyncIterator
from random import getrandbits

from gateway.config import EdgeConfig
from gateway.context import RequestContext, Timeline
from gateway.encoding import request_body_decoder
from gateway.errors import ClientGone, PayloadTooLarge
from gateway.headers import HOP_BY_HOP
from gateway.memo import remember
from gateway.types import RawHeaders, Receive, Scope

__all__ = ["HOP_BY_HOP", "RequestEdge", "read_body"]
# Request headers the edge consumes instead of forwarding verbatim.
_CONSUMED = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"authorization",
    b"api-key",
    b"x-api-key",
    b"accept-encoding",
    b"content-encoding",
    b"expect",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"forwarded",
    b"x-request-id",
    b"traceparent",
    b"tracestate",
}
#: the client's credentials: consumed, never forwarded (the backend sends its own key)
_CREDENTIALS = frozenset({b"authorization", b"api-key", b"x-api-key"})
#: consumed headers whose repeated lines make one list
_JOINED = frozenset({b"x-forwarded-for", b"connection"})
#: consumed headers kept on the context as they are
_ON_CONTEXT = {
    b"accept-encoding": "accept_encoding",
    b"content-encoding": "content_encoding",
    b"content-length": "content_length",
}
#: forwarded, and also noted for the cache (docs/spec.md §10)
_NOTED = frozenset({b"cache-control", b"openai-organization", b"openai-project"})
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,200}")
#: docs/spec.md §6: edge times more than 1 s ahead of ours or older than 60 s are discarded (and
#: marked)
MAX_FUTURE_S = 1.0
MAX_AGE_S = 60.0
_TRUST_CACHE_MAX = 4096


class RequestEdge:
    """Where a request enters the request path (the edge hop): the proxies it trusts, what
    their ``X-Forwarded-*`` and edge hop headers say, the request id and the trace ids; one per
    app, :meth:`accept` makes each request's context."""

    def __init__(self, cfg: EdgeConfig) -> None:
        self._networks = [ipaddress.ip_network(n, strict=False) for n in cfg.trusted_proxies]
        self._trust_cache: dict[str, bool] = {}
        #: lower-cased timing header -> hop name, outermost first
        self.hop_headers: dict[bytes, str] = {h.header.lower().encode(): h.name for h in cfg.hops}
        self.hop_names = [h.name for h in cfg.hops]

    def trusts(self, host: str) -> bool:
        trusted = self._trust_cache.get(host)
        if trusted is None:
            try:
                addr = ipaddress.ip_address(host)
            except ValueError:
                trusted = False  # unix sockets, names: never trusted implicitly
            else:
                trusted = any(addr in net for net in self._networks)
            remember(self._trust_cache, host, trusted, _TRUST_CACHE_MAX)
        return trusted

    def accept(self, scope: Scope) -> RequestContext:
        """Build the request context from the ASGI scope (one pass over the headers)."""
        ctx = RequestContext(scope, Timeline())
        ctx.peer_trusted = self.trusts(ctx.peer)
        forward, seen, hop_values = self._scan(ctx, scope["headers"])
        rid = seen.get(b"x-request-id")
        ctx.request_id = (
            # not a secret (it is echoed and logged): the PRNG, not a getrandom syscall per request
            rid.decode() if rid and _REQUEST_ID.fullmatch(rid) else f"{getrandbits(128):032x}"
        )
        forward.append(("x-request-id", ctx.request_id))
        self._forwarding(ctx, forward, seen)
        ctx.upstream_headers = forward
        tp = seen.get(b"traceparent")
        if tp is not None:
            ctx.incoming_trace = (tp, seen.get(b"tracestate"))
        if hop_values:
            if ctx.peer_trusted:
                self._edge_times(ctx, hop_values)
            else:
                ctx.edge_marks = dict.fromkeys(hop_values, "untrusted")
        return ctx

    def _scan(
        self, ctx: RequestContext, headers: RawHeaders
    ) -> tuple[list[tuple[str, str]], dict[bytes, bytes], dict[str, bytes] | None]:
        """Split the headers: forwarded as they are, consumed here (``seen``), edge timings."""
        forward: list[tuple[str, str]] = []
        seen: dict[bytes, bytes] = {}
        hop_values: dict[str, bytes] | None = None
        hop_headers = self.hop_headers
        for name, value in headers:
            if name not in _CONSUMED:
                if hop_headers and name in hop_headers:
                    if hop_values is None:
                        hop_values = {}
                    hop_values[hop_headers[name]] = value
                pair = (name.decode("latin-1"), value.decode("latin-1"))
                forward.append(pair)
                if name in _NOTED:
                    _note(ctx, name, value, pair)
            elif name in _CREDENTIALS:
                # never forwarded, never logged (docs/spec.md §5): kept only to tell callers apart
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    value = value[7:]
                ctx.credential = value.strip()
            elif (field := _ON_CONTEXT.get(name)) is not None:
                setattr(ctx, field, value)
            elif name in _JOINED and name in seen:  # a list split over several lines
                seen[name] = seen[name] + b", " + value
            else:
                seen[name] = value
        connection = seen.get(b"connection")
        if connection:  # RFC 9110 §7.6.1: headers named by Connection are hop-by-hop too
            connection_tokens = {t.strip().lower() for t in connection.decode("latin-1").split(",")}
            forward = [(k, v) for k, v in forward if k.lower() not in connection_tokens]
            if hop_values:
                self._drop_named(hop_values, connection_tokens)
        return forward, seen, hop_values

    def _drop_named(self, hop_values: dict[str, bytes], connection_tokens: set[str]) -> None:
        for hop, header in zip(self.hop_names, self.hop_headers, strict=True):
            if header.decode() in connection_tokens:
                hop_values.pop(hop, None)

    def _forwarding(
        self, ctx: RequestContext, forward: list[tuple[str, str]], seen: dict[bytes, bytes]
    ) -> None:
        """X-Forwarded-For/-Proto/-Host and Forwarded: a chain is kept only from a trusted peer."""
        trusted = ctx.peer_trusted
        peer = ctx.peer
        xff = seen.get(b"x-forwarded-for")
        if trusted and xff:
            chain = xff.decode("latin-1")
            forward.append(("x-forwarded-for", f"{chain}, {peer}" if peer else chain))
            ctx.client_address = self._client_from_chain(chain) or peer
        elif peer:
            forward.append(("x-forwarded-for", peer))
        xfp = seen.get(b"x-forwarded-proto")
        scheme = ctx.scope.get("scheme", "http")
        forward.append(("x-forwarded-proto", xfp.decode("latin-1") if trusted and xfp else scheme))
        xfh = seen.get(b"x-forwarded-host")
        host = seen.get(b"host")
        if trusted and xfh:
            forward.append(("x-forwarded-host", xfh.decode("latin-1")))
        elif host:
            forward.append(("x-forwarded-host", host.decode("latin-1")))
        fwd = seen.get(b"forwarded")
        if trusted and fwd:
            forward.append(("forwarded", fwd.decode("latin-1")))

    def _edge_times(self, ctx: RequestContext, values: dict[str, bytes]) -> None:
        """Accept each edge hop's time unless unparseable, in the future (> 1 s) or stale."""
        now = ctx.timeline.wall_ns / 1e9
        times: list[tuple[str, int, float]] = []
        marks: dict[str, str] = {}
        for index, name in enumerate(self.hop_names, start=1):
            raw = values.get(name)
            if raw is None:
                continue  # not behind that hop this time: nothing to mark
            at = _raw_time(raw)
            if at is None:
                marks[name] = "invalid"
            elif at > now + MAX_FUTURE_S:
                marks[name] = "future"
            elif at < now - MAX_AGE_S:
                marks[name] = "stale"
            else:
                times.append((name, index, at))
        ctx.edge_times = times
        if marks:
            ctx.edge_marks = marks

    def _client_from_chain(self, chain: str) -> str | None:
        # Walk right to left past our own trusted proxies; the first other address is the client.
        hosts = [h.strip() for h in chain.split(",") if h.strip()]
        for h in reversed(hosts):
            if not self.trusts(h):
                return h
        return hosts[0] if hosts else None


def _note(ctx: RequestContext, name: bytes, value: bytes, pair: tuple[str, str]) -> None:
    """Forwarded headers the cache keys on (docs/spec.md §10)."""
    if name == b"cache-control":
        cc = ctx.cache_control
        ctx.cache_control = value if cc is None else cc + b", " + value
    else:
        if ctx.forwarded_org is None:
            ctx.forwarded_org = {}
        ctx.forwarded_org[pair[0]] = pair[1]


def _raw_time(value: bytes | None) -> float | None:
    """Parse an X-Request-Start style value to epoch seconds; the unit comes from its magnitude.

    ``t=1700000000.123`` (s), ``t=1700000000123`` (ms), ``t=1700000000123456`` (µs), bare
    digits, and ns for 19-digit values. Returns None for anything unparseable.
    """
    if not value:
        return None
    text = value.strip()
    if text[:2] in (b"t=", b"T="):
        text = text[2:]
    # some LBs send "t=<value> D=<duration>"; keep the first token
    text = text.split()[0] if text else text
    try:
        v = float(text)
    except ValueError:
        return None
    if v != v or v <= 0 or v == float("inf"):
        return None
    if v >= 1e17:
        return v / 1e9
    if v >= 1e14:
        return v / 1e6
    if v >= 1e11:
        return v / 1e3
    return v


async def read_body(ctx: RequestContext, receive: Receive, limit: int) -> bytes:
    """Read the whole request body, decoding its Content-Encoding as it arrives (docs/spec.md §9).

    Refuses past ``limit`` bytes — counted after decoding, so a decompression bomb stops at
    the limit with bounded memory (413) — and unsupported codings (415).
    """
    declared = ctx.content_length
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes",
            code="body_too_large",
        )
    coding = ctx.content_encoding
    decoder = None
    if coding is not None and coding.strip().lower() not in (b"", b"identity"):
        decoder = request_body_decoder(coding, limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        ctx.disconnected = True
        raise ClientGone()
    body: bytes = message.get("body", b"")
    if decoder is None and not message.get("more_body", False):
        if len(body) > limit:
            raise _too_large(limit)
        ctx.timeline.body_received = time.perf_counter()
        return body
    parts: list[bytes] = []
    size = 0
    while True:
        size += len(body)
        if size > limit:  # raw bytes: for identity the limit; for codings a cap on the input
            raise _too_large(limit)
        parts.append(body if decoder is None else decoder.decode(body))
        if not message.get("more_body", False):
            break
        message = await receive()
        if message["type"] == "http.disconnect":
            ctx.disconnected = True
            raise ClientGone()
        body = message.get("body", b"")
    if decoder is not None:
        parts.append(decoder.flush())
    ctx.timeline.body_received = time.perf_counter()
    return b"".join(parts)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body exceeds the limit of {limit} bytes", code="body_too_large"
    )


def stream_body(ctx: RequestContext, receive: Receive, limit: int) -> AsyncIterator[bytes] | None:
    """The request body as an async iterator, for passthrough (None when there is none).

    Bounded like :func:`read_body` (413 past ``limit``), but never held whole.
    """
    has_body = False
    for name, value in ctx.scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise _too_large(limit)
            has_body = value != b"0"
        elif name == b"transfer-encoding":
            has_body = True
    if not has_body:
        return None

    async def chunks() -> AsyncIterator[bytes]:
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                ctx.disconnected = True
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return

    return chunks()
