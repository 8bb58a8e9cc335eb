"""The canonical request target (docs/spec.md §25): one spelling of a request's path, made once at
the edge, which every later decision — routing, stateful ids, ownership, pricing, passthrough —
and the upstream see.

The rules (RFC 3986 §6.2.2, with what an API gateway must add to it):

- a percent-escape of a character a path segment may hold as it is — the unreserved ones
  (``A-Z a-z 0-9 - . _ ~``, RFC 3986 §2.3), the sub-delims but ``;`` and ``:`` ``@`` (the
  ``pchar`` of §3.3) — is decoded: ``%72esp_1`` is ``resp_1``, ``%3A`` is ``:``; every other
  escape stays, its hex upper-cased (``%c3%a9`` is ``%C3%A9``), so an id has one spelling whatever
  an upstream decodes;
- refused (:class:`BadTarget`, a 400): an encoded ``/`` or ``\\`` (``%2F``, ``%5C``) or a raw
  ``\\`` — a second segment separator for some upstreams; ``;`` raw or encoded — path
  parameters, which servlet containers strip (``..;/``); ``%25`` (an escaped ``%``: double
  encoding), ``%3F`` and ``%23`` (``?`` and ``#`` hidden in a segment); NUL and every other
  control character, raw or encoded; any other raw character outside ``pchar`` (space, ``"``,
  ``<``, ``{``, 8-bit bytes); a malformed escape; a ``.`` or ``..`` segment in any spelling
  (``%2e%2e``, ``.%2E``): nothing the gateway serves needs one, and resolving it would let a
  request name a path its spelling hides;
- empty segments are dropped: ``/v1//files`` is ``/v1/files`` (nginx's ``merge_slashes``) and a
  trailing ``/`` is dropped (``/v1/files/`` is ``/v1/files``); the root is ``/``.

The query string is kept as the client sent it; only control characters, a raw space and a
fragment's ``#`` are refused there.

An already-canonical path — nearly every request — is recognised by one regular-expression match
and returned as it is; only the others are rebuilt.

>>> canonical_path(b"/v1/chat/completions")
b'/v1/chat/completions'
>>> canonical_path(b"/v1/responses/%72esp_1"), canonical_path(b"/v1//files/")
(b'/v1/responses/resp_1', b'/v1/files')
>>> canonical_path(b"/v1/files/a%3ab%c3%a9"), canonical_path(b"/")
(b'/v1/files/a:b%C3%A9', b'/')
>>> canonical_path(b"/v1/%2e%2e/admin")
Traceback (most recent call last):
...
gateway.target.BadTarget: the path may not hold a "." or ".." segment
>>> canonical_path(b"/v1/files/..;/admin")
Traceback (most recent call last):
...
gateway.target.BadTarget: the path may not hold ";" (path parameters)
>>> canonical_path(b"/v1/files/a%2fb")
Traceback (most recent call last):
...
gateway.target.BadTarget: the path may not hold "\\" or an encoded "/" or "\\"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["BadTarget", "canonical_path", "canonical_scope", "check_query", "is_canonical"]


class BadTarget(ValueError):
    """A request target the gateway will not give a canonical form (answered 400)."""


#: the characters a canonical path segment holds as they are: RFC 3986 §3.3 ``pchar`` without
#: ``;`` (path parameters) and without escapes
_PCHAR = rb"A-Za-z0-9\-._~!$&'()*+,=:@"
#: the escapes a canonical path keeps (upper-case hex): the printable characters neither decoded
#: nor refused (space " < > [ ] ^ ` { | }) and every 8-bit byte
_KEPT = rb"%(?:2[02]|3[CE]|5[BDE]|60|7[BCD]|[89A-F][0-9A-F])"
#: a canonical path: "/" or "/"-separated non-empty segments of plain pchar and kept escapes,
#: none "." or ".." (possessive runs: a long segment that fails does not backtrack)
_CANONICAL = re.compile(
    rb"/|(?:/(?!\.\.?(?:/|\Z))(?:[" + _PCHAR + rb"]++|" + _KEPT + rb")+)+"
).fullmatch
#: the common canonical path, with no escape at all: one character class per segment, the
#: cheapest match (escapes take the rebuild, which keeps a canonical path as it is)
_PLAIN = re.compile(rb"/|(?:/(?!\.\.?(?:/|\Z))[" + _PCHAR + rb"]+)+").fullmatch
#: what a segment may hold before decoding: plain pchar and well-formed escapes
_SEGMENT = re.compile(rb"(?:[" + _PCHAR + rb"]|%[0-9A-Fa-f]{2})*").fullmatch
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
#: the escapes decoded: each character that a segment may hold as it is
_DECODED = frozenset(
    bytes((c,))
    for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,=:@"
)
#: a second segment separator for some upstreams, in any spelling
_SEPARATOR = 'the path may not hold "\\" or an encoded "/" or "\\"'
_PARAMETERS = 'the path may not hold ";" (path parameters)'
_CONTROL = "the path may not hold a control character"
#: escaped characters refused, and why
_REFUSED = {
    0x2F: _SEPARATOR,
    0x5C: _SEPARATOR,
    0x3B: _PARAMETERS,
    0x25: 'the path may not hold an encoded "%" (double encoding)',
    0x3F: 'the path may not hold an encoded "?" or "#"',
    0x23: 'the path may not hold an encoded "?" or "#"',
}
#: a query string's refused bytes: control characters, a raw space and "#" (RFC 3986 §3.4; a
#: request target has no fragment, RFC 9112 §3.2)
_BAD_QUERY = re.compile(rb"[\x00-\x20#\x7f]").search


def is_canonical(path: bytes) -> bool:
    """Whether ``path`` is already in the canonical form (one match, nothing rebuilt).

    >>> is_canonical(b"/v1/files"), is_canonical(b"/v1/files/"), is_canonical(b"/v1/./x")
    (True, False, False)
    """
    return _CANONICAL(path) is not None


def canonical_scope(scope: Mapping[str, Any]) -> bool:
    """Whether an ASGI scope holds a canonical target as gateway/server/http1.py and
    gateway/server/websocket.py write it: ``path`` and ``raw_path`` one canonical
    spelling (a scope from another server holds the decoded path and the raw one).

    >>> canonical_scope({"path": "/v1/files", "raw_path": b"/v1/files"})
    True
    >>> canonical_scope({"path": "/v1/resp_1", "raw_path": b"/v1/%72esp_1"})
    False
    """
    raw = scope.get("raw_path")
    return (
        isinstance(raw, bytes)
        and _CANONICAL(raw) is not None
        and raw.decode("ascii") == scope["path"]
    )


def canonical_path(path: bytes) -> bytes:
    """The canonical form of a request path (see the module), or :class:`BadTarget`."""
    if _PLAIN(path) is not None:
        return path
    if path[:1] != b"/":
        raise BadTarget("the request target must be a path starting with /")
    segments = []
    for raw in path.split(b"/"):
        if not raw:
            continue  # "//" and a trailing "/": one spelling
        segment = _segment(raw)
        if segment in (b".", b".."):
            raise BadTarget('the path may not hold a "." or ".." segment')
        segments.append(segment)
    return b"/" + b"/".join(segments)


def _segment(raw: bytes) -> bytes:
    if _SEGMENT(raw) is None:
        raise BadTarget(_why_not(raw))
    if b"%" not in raw:
        return raw
    return _ESCAPE.sub(_unescape, raw)


def _unescape(match: re.Match[bytes]) -> bytes:
    code = int(match.group(1), 16)
    char = bytes((code,))
    if char in _DECODED:
        return char
    refused = _REFUSED.get(code)
    if refused is not None:
        raise BadTarget(refused)
    if code < 0x20 or code == 0x7F:
        raise BadTarget(_CONTROL)
    return b"%%%02X" % code


def _why_not(raw: bytes) -> str:
    """The first reason a segment is refused before decoding."""
    for index, code in enumerate(raw):
        if code == 0x3B:
            return _PARAMETERS
        if code == 0x5C:
            return _SEPARATOR
        if code < 0x20 or code == 0x7F:
            return _CONTROL
        if code == 0x25 and not re.fullmatch(rb"%[0-9A-Fa-f]{2}", raw[index : index + 3]):
            return "the path holds a malformed percent-escape"
    return "the path holds a character a request path may not (RFC 3986 §3.3)"


def check_query(query: bytes) -> None:
    """Refuse a query string with a control character, a raw space or a ``#``; else keep it
    as sent.

    >>> check_query(b"limit=2&after=file-1")
    >>> check_query(b"a=1\\x00")
    Traceback (most recent call last):
    ...
    gateway.target.BadTarget: the query string may not hold a control character, a space or "#"
    """
    if _BAD_QUERY(query) is not None:
        raise BadTarget('the query string may not hold a control character, a space or "#"')
