"""What the server decides about a request head before the app sees it, and the answers it
gives itself (docs/spec.md §25).

:class:`gateway.server.http1.Http1Protocol` reads the head; this module holds the rules it
applies once the head is in (:func:`admit`):

- the target: its canonical form (:mod:`gateway.target`) becomes ``scope["path"]`` and
  ``scope["raw_path"]`` — the same spelling in both, so no module can pick another — and the
  query string is kept as sent; a target with no canonical form is 400 ``invalid_path``;
- ``Host``: exactly one, valid (RFC 9112 §3.2: ``uri-host [":" port]``), on HTTP/1.1; none on
  HTTP/1.1, two, or an invalid one is 400 ``invalid_host``;
- ``TRACE`` (it would echo the backend's key: RFC 9110 §9.3.8) and ``CONNECT`` are 405
  ``method_not_allowed``, never forwarded;
- ``Origin`` (:mod:`gateway.origins`): a foreign one is 403 ``origin_not_allowed``; an allowed
  one's preflight is answered here (204), and its other answers carry CORS.

Each refusal is an :class:`IntakeAnswer`: a tiny ASGI app the connection runs in the request's
place, so pipelined answers keep their order. A refusal the client may still be sending a body
to ends in :class:`Lingering`.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httptools

from gateway.context import BODY_FOLLOWS
from gateway.errors import error_body
from gateway.memo import remember
from gateway.origins import OriginPolicy, preflight
from gateway.target import BadTarget, canonical_path, check_query
from gateway.types import RawHeaders, Receive, Scope, Send

__all__ = ["NOTED", "IntakeAnswer", "Lingering", "admit", "refusal", "valid_host"]

#: the request headers the server reads besides the app (lower-case names)
NOTED = frozenset(
    (
        b"host",
        b"expect",
        b"upgrade",
        b"origin",
        b"access-control-request-method",
        b"access-control-request-headers",
    )
)
#: RFC 9110 §7.2 / RFC 3986 §3.2.2: uri-host [":" port] (an empty value is valid, §7.2)
_HOST = re.compile(
    rb"(?:\[[0-9A-Za-z:._~!$&'()*+,;=\-]+\]|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)"
    rb"(?::[0-9]*)?"
).fullmatch
_HOSTS: dict[bytes, bool] = {}
_HOSTS_MAX = 1024
#: never forwarded: TRACE reflects the request (the backend's key with it), CONNECT tunnels
_NOT_SERVED = frozenset(("TRACE", "CONNECT"))
_ALLOW = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
#: a header seen twice where one is allowed
TWICE = b"\x00twice"
_TYPES = {400: "invalid_request_error", 403: "permission_error", 405: "invalid_request_error"}


def valid_host(value: bytes) -> bool:
    """Whether a ``Host`` value is ``uri-host [":" port]`` (remembered: clients send few).

    >>> [valid_host(v) for v in (b"gw:8080", b"[::1]:80", b"", b"a b", b"a/b", b"a@b", b"a:b:c")]
    [True, True, True, False, False, False, False]
    """
    valid = _HOSTS.get(value)
    if valid is None:
        valid = remember(_HOSTS, value, _HOST(value) is not None, _HOSTS_MAX)
    return valid


class IntakeAnswer:
    """A whole answer the server gives itself, as an ASGI app run in the request's place."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: RawHeaders, body: bytes = b"") -> None:
        self.status = status
        self.headers = headers
        self.body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = list(self.headers)
        if self.status != 204:
            headers.append((b"content-length", str(len(self.body)).encode()))
        start = {"type": "http.response.start", "status": self.status, "headers": headers}
        start[BODY_FOLLOWS] = True
        await send(start)
        await send({"type": "http.response.body", "body": self.body})


def refusal(status: int, code: str, message: str, *extra: tuple[bytes, bytes]) -> IntakeAnswer:
    """A refusal in the OpenAI error shape (docs/spec.md §5).

    >>> refusal(405, "method_not_allowed", "no").body
    b'{"error":{"message":"no","type":"invalid_request_error","code":"method_not_allowed","param":null}}'
    """
    body = error_body(message, _TYPES.get(status, "invalid_request_error"), code)
    headers = [(b"content-type", b"application/json"), (b"x-should-retry", b"false"), *extra]
    return IntakeAnswer(status, headers, body)


#: a target httptools cannot parse as a URI (an authority-form, ``*``)
_BAD_TARGET = refusal(400, "invalid_path", "invalid request path: the target is not a path")


def admit(
    scope: dict[str, Any],
    target: bytes,
    version: str,
    host: bytes | None,
    noted: dict[bytes, bytes] | None,
    origins: OriginPolicy,
) -> IntakeAnswer | bytes | None:
    """The server's verdict on a request head (see the module): None to serve it, the origin to
    serve it with CORS, or the :class:`IntakeAnswer` to give instead. Sets ``path``,
    ``raw_path`` and ``query_string`` in ``scope`` (the canonical target)."""
    method: str = scope["method"]
    if method in _NOT_SERVED:
        message = f"{method} is not served by the gateway"
        return refusal(405, "method_not_allowed", message, (b"allow", _ALLOW))
    try:
        if target[:1] == b"/":  # origin-form, nearly every request: no URI parse needed
            raw, _, query = target.partition(b"?")
        else:  # absolute-form (RFC 9112 §3.2.2): its path; anything else is no path
            url = httptools.parse_url(target)
            raw, query = url.path or b"/", url.query or b""
        path = canonical_path(raw)
        if query:
            check_query(query)
    except httptools.HttpParserInvalidURLError:
        return _BAD_TARGET
    except BadTarget as exc:
        return refusal(400, "invalid_path", f"invalid request path: {exc}")
    scope["path"] = path.decode("ascii")
    scope["raw_path"] = path
    scope["query_string"] = query
    if host is TWICE or (host is None and version == "1.1"):
        return refusal(400, "invalid_host", "an HTTP/1.1 request needs exactly one Host header")
    if host is not None and not valid_host(host):
        return refusal(400, "invalid_host", "the Host header is not a valid host[:port]")
    if noted is None:
        return None
    return _cors(scope, path, method, noted, origins)


def _cors(
    scope: dict[str, Any],
    path: bytes,
    method: str,
    noted: dict[bytes, bytes],
    origins: OriginPolicy,
) -> IntakeAnswer | bytes | None:
    origin = noted.get(b"origin")
    if origin is None:
        return None
    if origin is TWICE or not origins.allows(origin, scope.get("server"), path):
        return refusal(
            403,
            "origin_not_allowed",
            "requests from this web page's origin are not accepted: list it in the gateway's "
            "[server] allowed_origins",
        )
    if method == "OPTIONS" and b"access-control-request-method" in noted:
        return IntakeAnswer(204, preflight(origin, noted.get(b"access-control-request-headers")))
    return origin


class Lingering(asyncio.Protocol):
    """nginx's lingering close for a connection answered early (413, 408, 431, 400, a refusal
    before its body was read): the answer goes out, then a half-close (FIN: the client reads
    the answer and the end), then whatever the client still sends is read and dropped — never
    parsed, never buffered — until it closes its side or ``seconds`` pass, when the connection
    is aborted. Closing at once with unread bytes would send a reset that can destroy the
    answer in the client's buffers before it is read; reading the declared body to its end
    would hold the connection for as long as the client likes."""

    def __init__(self, transport: asyncio.Transport, seconds: float) -> None:
        self.transport = transport
        self._timer = asyncio.get_running_loop().call_later(seconds, transport.abort)

    def start(self, read_paused: bool) -> None:
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()  # after what is buffered: the answer reaches the client whole
        else:
            transport.close()
        if read_paused:
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        pass  # a body nobody will use

    def eof_received(self) -> bool:
        self._timer.cancel()
        return False  # the client is done too: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
