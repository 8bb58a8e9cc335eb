"""The browser Origin policy and CORS (docs/spec.md §25): which web pages may call the gateway.

A browser names the page a request comes from in ``Origin`` (RFC 6454) on every cross-origin
request, on every ``POST`` and on every WebSocket handshake; a request without one is not from a
browser page and passes. An ``Origin`` the policy does not allow is refused (403) at the edge,
whatever the method or content type: a page can send a form's content types (``text/plain``,
``application/x-www-form-urlencoded``, ``multipart/form-data``) and open a WebSocket
(cross-site WebSocket hijacking, RFC 6455 §10.2) without asking first, and any other request
only after a preflight this policy answers without a grant — so only those are refused in
practice. An allowed origin gets CORS: its preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered at the edge, and its answers carry
``Access-Control-Allow-Origin`` with ``Vary: Origin``.

The policy (``[server] allowed_origins``):

- unset: the gateway's own origin — the scheme, address and port the connection was accepted on
  (``http://10.0.0.5:8080``), never the client's ``Host``, which a DNS-rebinding page controls —
  and loopback origins on any port: ``http(s)://127.0.0.1``, ``localhost``, ``[::1]``;
- a list: those origins (``"https://app.example"``, ``"http://localhost:*"`` for any port) as
  well as the gateway's own; ``"*"`` allows every origin (unsafe: any web page a user of the
  gateway opens may use it);
- ``/mcp`` and ``/mcp/{server}`` also admit the origins an MCP server lists in its own
  ``allowed_origins`` (docs/spec.md §23), which that endpoint then checks per server.

``Origin: null`` (a sandboxed frame, a ``file:`` page) is allowed only by ``"*"``.

>>> policy = OriginPolicy(None)
>>> server = ("10.0.0.5", 8080)
>>> [policy.allows(o, server) for o in (b"http://localhost:3000", b"http://10.0.0.5:8080")]
[True, True]
>>> [policy.allows(o, server) for o in (b"https://evil.example", b"null", b"http://10.0.0.5:81")]
[False, False, False]
>>> OriginPolicy(["https://app.example"]).allows(b"https://APP.example:443", server)
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = [
    "ANY_PORT",
    "LOOPBACK",
    "OriginPolicy",
    "check_entries",
    "cors_headers",
    "origin_key",
    "preflight",
]

#: ``scheme://host[:port]`` as browsers serialise an origin (RFC 6454 §6.2); the host a name, an
#: IPv4 address or a bracketed IPv6 literal
_ORIGIN = re.compile(
    rb"([a-z][a-z0-9+.\-]*)://(\[[0-9a-f:.]+\]|[a-z0-9\-._~%!$&'()*+,;=]+)(?::([0-9]{1,5}))?"
)
_DEFAULT_PORTS = {b"http": 80, b"https": 443, b"ws": 80, b"wss": 443}
#: an entry's port that matches any port
ANY_PORT = -1
#: the loopback origins every policy allows, on any port
LOOPBACK = tuple(
    f"{scheme}://{host}:*"
    for scheme in ("http", "https")
    for host in ("127.0.0.1", "localhost", "[::1]")
)
#: a list of header names as Access-Control-Request-Headers carries it (RFC 9110 §5.6.1 tokens)
_TOKENS = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z\-]+(?:[ \t]*,[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z\-]+)*")
_METHODS = b"GET, HEAD, POST, PUT, PATCH, DELETE"
#: decisions remembered per (origin, server address): browsers send few distinct origins
_MEMO_MAX = 1024

Key = tuple[bytes, bytes, int]


def origin_key(origin: bytes) -> Key | None:
    """``(scheme, host, port)`` of an origin (lower-cased, the scheme's default port filled in),
    or None when it is not one (``null`` included).

    >>> origin_key(b"HTTP://Example.COM"), origin_key(b"http://[::1]:8080"), origin_key(b"null")
    ((b'http', b'example.com', 80), (b'http', b'[::1]', 8080), None)
    """
    match = _ORIGIN.fullmatch(origin.lower())
    if match is None:
        return None
    scheme, host, port = match.groups()
    if port is not None:
        number = int(port)
        if number > 65535:
            return None
    else:
        number = _DEFAULT_PORTS.get(scheme, 0)
    return scheme, host, number


def _entry(text: str) -> Key:
    """An ``allowed_origins`` entry: an origin, its port ``*`` for any port (ValueError if not)."""
    raw = text.strip().encode("utf-8", "surrogateescape")
    wildcard = raw.endswith(b":*")
    key = origin_key(raw[:-2] if wildcard else raw)
    if key is None:
        raise ValueError(
            f'{text!r} is not an origin: "scheme://host[:port]", ":*" for any port, or "*"'
        )
    return (key[0], key[1], ANY_PORT) if wildcard else key


def check_entries(entries: Iterable[str]) -> list[str]:
    """The problems of configured ``allowed_origins`` entries (for the config's errors).

    >>> check_entries(["*", "https://a.example", "http://localhost:*", "a.example"])
    ['\\'a.example\\' is not an origin: "scheme://host[:port]", ":*" for any port, or "*"']
    """
    problems = []
    for text in entries:
        if text.strip() == "*":
            continue
        try:
            _entry(text)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


class OriginPolicy:
    """``[server] allowed_origins`` (None: the default), decided once per distinct origin."""

    def __init__(self, allowed: Sequence[str] | None, mcp: Iterable[str] = ()) -> None:
        entries = list(LOOPBACK) + list(allowed or ())
        #: "*" in the list: every origin passes
        self.everyone = any(e.strip() == "*" for e in entries)
        self._exact = {_entry(e) for e in entries if e.strip() != "*"}
        self._any_port = {(s, h) for s, h, p in self._exact if p == ANY_PORT}
        mcp = list(mcp)
        # an MCP server's list is compared as written there (gateway/mcp/access.py): an entry
        # that is no origin admits nothing here either
        self._mcp = {key for e in mcp if (key := origin_key(e.strip().encode())) is not None}
        self._mcp_everyone = any(e.strip() == "*" for e in mcp)
        self._memo: dict[tuple[bytes, tuple[str, int] | None], bool] = {}

    def allows(
        self, origin: bytes, server: tuple[str, int] | None, path: str | bytes = b""
    ) -> bool:
        """Whether a request from ``origin`` to a connection accepted on ``server`` may be
        served (``path``: only ``/mcp…`` consults the MCP servers' lists)."""
        if self.everyone:
            return True
        memo = self._memo
        decided = memo.get((origin, server))
        if decided is None:
            decided = self._decide(origin, server)
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[(origin, server)] = decided
        if not decided and (self._mcp or self._mcp_everyone) and _is_mcp(path):
            key = origin_key(origin)
            return self._mcp_everyone or (key is not None and key in self._mcp)
        return decided

    def _decide(self, origin: bytes, server: tuple[str, int] | None) -> bool:
        key = origin_key(origin)
        if key is None:
            return False
        if key in self._exact or key[:2] in self._any_port:
            return True
        if server is None:
            return False
        # the gateway's own origin: the address and port the connection was accepted on
        address, port = server
        host = f"[{address}]" if ":" in address else address
        return key[1] == host.lower().encode() and key[2] == port


def _is_mcp(path: str | bytes) -> bool:
    text = path.decode("latin-1") if isinstance(path, bytes) else path
    return text == "/mcp" or text.startswith("/mcp/")


def cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
    """What an allowed origin's answer carries (``Vary``: the answer differs by origin)."""
    return [
        (b"access-control-allow-origin", origin),
        (b"access-control-expose-headers", b"*"),
        (b"vary", b"Origin"),
    ]


def preflight(origin: bytes, request_headers: bytes | None) -> list[tuple[bytes, bytes]]:
    """The headers of a 204 answering an allowed origin's preflight (Fetch standard, "CORS
    protocol"): the methods the gateway serves, the headers asked for when they are a list of
    names, ten minutes' grace. No credentials: the API authenticates by header, never by cookie.

    >>> dict(preflight(b"http://localhost:3000", b"authorization, content-type"))[
    ...     b"access-control-allow-headers"]
    b'authorization, content-type'
    """
    headers = [
        (b"access-control-allow-origin", origin),
        (b"access-control-allow-methods", _METHODS),
        (b"access-control-max-age", b"600"),
        (b"vary", b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
    ]
    if request_headers and _TOKENS.fullmatch(request_headers.strip()):
        headers.append((b"access-control-allow-headers", request_headers.strip()))
    return headers
