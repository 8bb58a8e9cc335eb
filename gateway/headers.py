"""Header helpers every layer shares: the hop-by-hop set, lookup and copying (docs/spec.md §5).

Header names are lower-case bytes everywhere inside the gateway (ASGI gives them so; the
transports lower-case the upstream's).

>>> header_value([(b"content-type", b"text/plain")], b"content-type")
b'text/plain'
>>> copy_headers([(b"connection", b"x-a"), (b"x-a", b"1"), (b"x-b", b"2")])
[(b'x-b', b'2')]
"""

from __future__ import annotations

from gateway.types import RawHeaders

#: RFC 9110 §7.6.1 plus the legacy ones docs/spec.md §5 names: never forwarded in either direction
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"trailer",
    }
)
#: the CORS response headers: the gateway grants CORS itself, to the origins it allows
#: (docs/spec.md §25), never an upstream's grant
CORS_RESPONSE = frozenset(
    {
        b"access-control-allow-origin",
        b"access-control-allow-credentials",
        b"access-control-allow-methods",
        b"access-control-allow-headers",
        b"access-control-expose-headers",
        b"access-control-max-age",
    }
)
#: response headers never copied from the upstream (the gateway sets its own)
DROP_RESPONSE = (
    HOP_BY_HOP | CORS_RESPONSE | {b"content-length", b"server", b"date", b"x-request-id"}
)
#: the usual Connection values: they name only hop-by-hop headers (dropped already)
_PLAIN_CONNECTION = frozenset((b"keep-alive", b"close", b"Keep-Alive", b"Close"))
#: answers the gateway encodes itself vary by Accept-Encoding (docs/spec.md §9)
VARY = (b"vary", b"Accept-Encoding")


def header_value(headers: RawHeaders, name: bytes) -> bytes | None:
    """The first value of ``name`` (lower-case), or None."""
    for k, v in headers:
        if k == name:
            return v
    return None


def copy_headers(upstream: RawHeaders, drop: frozenset[bytes] = DROP_RESPONSE) -> RawHeaders:
    """The upstream's response headers minus ``drop`` and whatever its Connection names."""
    out: RawHeaders = []
    connection_named: set[bytes] = set()
    for k, v in upstream:
        if k == b"connection":
            if v not in _PLAIN_CONNECTION:  # those name nothing that is not dropped anyway
                connection_named.update(t.strip().lower() for t in v.split(b","))
        elif k not in drop:
            if k == b"vary" and v.strip().lower() == b"accept-encoding":
                continue  # the gateway sends its own
            out.append((k, v))
    if connection_named:
        out = [(k, v) for k, v in out if k not in connection_named]
    return out


def upstream_request_id(upstream: RawHeaders) -> RawHeaders:
    """The upstream's own x-request-id, returned to the client as ``x-upstream-request-id``."""
    v = header_value(upstream, b"x-request-id")
    return [(b"x-upstream-request-id", v)] if v is not None else []
