"""Cache keys, eligibility and request ``Cache-Control`` (docs/spec.md §10).

A key is ``gateway:cache:v1:<namespace>:<sha256 hex>``. The digest covers, each part
length-prefixed so no two different inputs can encode alike: the path, the query string,
the forwarded ``OpenAI-Organization`` and ``OpenAI-Project`` values (absent is not empty),
the scope (the tenant or credential digest; none when ``scope = "global"``) and the canonical
JSON body. Canonical means key order and whitespace do not matter, ``stream`` and
``stream_options`` do not count (one entry serves JSON and SSE), and ``0`` equals ``0.0``.

>>> canonical_json({"temperature": 0.0, "model": "m", "stream": True})
b'{"model":"m","temperature":0}'
>>> parse_cache_control(b'no-cache, Max-Age="60"')
CacheDirectives(no_cache=True, no_store=False, max_age=60.0)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.memo import remember

KEY_PREFIX = "gateway:cache:v1:"

#: top-level request fields that choose the response's form, not its content
_FORM_FIELDS = frozenset({"stream", "stream_options"})
#: integral floats inside this range become ints (orjson writes int64 at most)
_INT_MIN = -(2**63)
_INT_MAX = 2**63
#: header names (lower-cased) forwarded upstream that change the answer
_ORG = "openai-organization"
_PROJECT = "openai-project"

OPERATIONS = frozenset({"chat", "text_completion", "embeddings"})
#: docs/spec.md §5/§10: the endpoints whose answers may be cached. /v1/responses and /v1/messages
#: are
#: "chat" operations too (GenAI semantic conventions) but are never cached (BYPASS)
CACHEABLE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


# ---------------------------------------------------------------- canonical JSON


def _normalise(value: Any) -> Any:
    """A copy of ``value`` with integral floats as ints (``0.0`` -> ``0``), recursively."""
    cls = type(value)
    if cls is float:
        if value.is_integer() and _INT_MIN <= value < _INT_MAX:
            return int(value)
        return value
    if cls is dict:
        return {k: _normalise(v) for k, v in value.items()}
    if cls is list:
        return [_normalise(v) for v in value]
    return value


def _has_integral_float(payload: dict[str, Any]) -> bool:
    """Whether ``_normalise`` would change anything in ``payload`` (a walk that copies nothing).

    Iterative, and strings — the bulk of a request (messages) — are passed over inline.
    """
    pending: list[Any] = [payload]
    while pending:
        container = pending.pop()
        for v in container.values() if type(container) is dict else container:
            cls = type(v)
            if cls is str or cls is int or cls is bool or v is None:
                continue
            if cls is float:
                if v.is_integer() and _INT_MIN <= v < _INT_MAX:
                    return True
            elif cls is dict or cls is list:
                pending.append(v)
    return False


def canonical_json(payload: dict[str, Any]) -> bytes:
    """Sorted keys, no whitespace, without top-level ``stream``/``stream_options``.

    Does not mutate ``payload``. Raises ``TypeError`` (orjson.JSONEncodeError) for values
    JSON cannot hold, which a body parsed with orjson never contains. The usual request has no
    integral float and no form field: it is serialised as it is, without a copy.
    """
    body = payload
    if "stream" in body or "stream_options" in body:
        body = {k: v for k, v in body.items() if k not in _FORM_FIELDS}
    if _has_integral_float(body):
        body = {k: _normalise(v) for k, v in body.items()}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


# ---------------------------------------------------------------- keys


def _field(data: bytes | None) -> bytes:
    # 0x00 = absent; 0x01 + 8-byte big-endian length + bytes = present (maybe empty)
    if data is None:
        return b"\x00"
    return b"\x01" + len(data).to_bytes(8, "big") + data


#: the digest state after the constant prefix
_SEED = hashlib.sha256(b"llm-gateway cache key v1\x00")
#: (path, query, org, project, scope) -> the digest state after those fields: per request only
#: the body's field is hashed (a copy of the state, one update). Bounded: the values are the
#: client's (gateway/memo.py); long ones are hashed each time
_HEADS: dict[tuple[str, bytes, bytes | None, bytes | None, str | None], Any] = {}
_HEADS_MAX = 1024
_HEAD_VALUE_MAX = 512


def _head(
    path: str, query: bytes, org: bytes | None, project: bytes | None, scope: str | None
) -> Any:
    """The digest state after every field but the body (remembered per distinct value set)."""
    memo_key = (path, query, org, project, scope)
    head = _HEADS.get(memo_key)
    if head is None:
        head = _SEED.copy()
        head.update(
            b"".join(
                (
                    _field(path.encode()),
                    _field(query),
                    _field(org),
                    _field(project),
                    _field(None if scope is None else scope.encode()),
                )
            )
        )
        size = len(path) + len(query) + len(org or b"") + len(project or b"") + len(scope or "")
        if size <= _HEAD_VALUE_MAX:
            remember(_HEADS, memo_key, head, _HEADS_MAX)
    return head


def _forwarded(headers: Mapping[str, str] | None) -> tuple[bytes | None, bytes | None]:
    """The ``OpenAI-Organization`` and ``OpenAI-Project`` values (names case-insensitive;
    repeated fields combined with ", " in order, RFC 9110 §5.3)."""
    if not headers:
        return None, None
    org: list[str] = []
    project: list[str] = []
    for name, value in headers.items():
        lname = name.lower()
        if lname == _ORG:
            org.append(value)
        elif lname == _PROJECT:
            project.append(value)
    return (
        ", ".join(org).encode() if org else None,
        ", ".join(project).encode() if project else None,
    )


#: (namespace, the fields before the body, the body's bytes) -> the key: a request sent again
#: byte for byte (what a cache hit usually is) skips the canonical form and the digest. Small
#: bodies only, and bounded (gateway/memo.py): 512 x 4 KiB at most
_KEYS: dict[tuple[str, str, bytes, bytes | None, bytes | None, str | None, bytes], str] = {}
_KEYS_MAX = 512
_KEY_BODY_MAX = 4096


def cache_key(
    *,
    namespace: str,
    path: str,
    query: bytes,
    payload: dict[str, Any],
    scope: str | None,
    headers: Mapping[str, str] | None,
    body: bytes | None = None,
) -> str:
    """The entry key for one request.

    ``scope`` is None for ``cache.scope = "global"``, else the tenant / credential digest
    (``hops.auth.credential_scope``); two scopes never share a key. ``query`` is the raw
    query string (ASGI ``scope["query_string"]``); ``headers`` are the request headers
    forwarded upstream. ``body``: the bytes ``payload`` was parsed from (and is serialised to
    upstream), when the caller has them — the same bytes give the same key, remembered.
    """
    org, project = _forwarded(headers)
    memo = None
    if body is not None and len(body) <= _KEY_BODY_MAX:
        memo = (namespace, path, query, org, project, scope, body)
        known = _KEYS.get(memo)
        if known is not None:
            return known
    digest = _head(path, query, org, project, scope).copy()
    canonical = canonical_json(payload)
    digest.update(b"\x01" + len(canonical).to_bytes(8, "big"))
    digest.update(canonical)
    # {…} is a Redis Cluster hash tag: the entry and its lock (key + ":lock") share a slot, so
    # one script can read the entry and take the lock in a single round trip
    key = f"{KEY_PREFIX}{namespace}:{{{digest.hexdigest()}}}"
    if memo is not None:
        remember(_KEYS, memo, key, _KEYS_MAX)
    return key


# ---------------------------------------------------------------- eligibility


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float  # bool is not a temperature


def is_cacheable(
    operation: str, payload: dict[str, Any], mode: str, path: str | None = None
) -> bool:
    """docs/spec.md §10: which requests may be answered from (and stored in) the cache.

    ``mode = "deterministic"``: embeddings always; chat and text completions only with
    ``temperature == 0`` (absent means the API default 1) and ``n`` absent, null or 1.
    ``mode = "all"``: every request of the three operations. ``path`` (when given) must be one
    of :data:`CACHEABLE_PATHS`: a Responses or Messages call is a "chat" operation, never cached.

    >>> is_cacheable("chat", {"temperature": 0}, "deterministic", "/v1/chat/completions")
    True
    >>> is_cacheable("chat", {"temperature": 0}, "all", "/v1/responses")
    False
    """
    if operation not in OPERATIONS or (path is not None and path not in CACHEABLE_PATHS):
        return False
    if mode == "all" or operation == "embeddings":
        return True
    if mode != "deterministic":
        return False
    temperature = payload.get("temperature")
    if not _is_number(temperature) or temperature != 0:
        return False
    n = payload.get("n")
    return n is None or (_is_number(n) and n == 1)


# ---------------------------------------------------------------- Cache-Control


@dataclass(frozen=True, slots=True)
class CacheDirectives:
    """The request directives the cache honours (RFC 9111 §5.2.1)."""

    #: skip the lookup, still store the answer
    no_cache: bool = False
    #: neither look up nor store
    no_store: bool = False
    #: accept only entries younger than this many seconds
    max_age: float | None = None


NO_DIRECTIVES = CacheDirectives()
#: RFC 9111 §1.2.2: a delta-seconds too large to hold is taken as 2^31
_DELTA_MAX = 2**31
_PARSED_MAX = 256  # distinct header values remembered
_PARSED_VALUE_MAX = 256  # longer values are parsed each time, not remembered
_parsed: dict[bytes, CacheDirectives] = {}


def _split_directives(text: str) -> list[str]:
    """Split on commas outside quoted-strings (RFC 9110 §5.6.4), keeping the pieces raw."""
    items: list[str] = []
    start = 0
    quoted = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif quoted:
            if ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == ",":
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        out: list[str] = []
        chars = iter(value[1:-1])
        for ch in chars:
            out.append(next(chars, "") if ch == "\\" else ch)
        return "".join(out)
    return value


def _parse(value: bytes) -> CacheDirectives:
    no_cache = no_store = False
    max_age: float | None = None
    for item in _split_directives(value.decode("latin-1")):
        name, eq, arg = item.partition("=")
        name = name.strip(" \t").lower()
        if name == "no-cache":
            no_cache = True  # an argument (response syntax) is tolerated and ignored
        elif name == "no-store":
            no_store = True
        elif name == "max-age" and eq and max_age is None:
            digits = _unquote(arg.strip(" \t"))
            if digits.isascii() and digits.isdigit():  # 1*DIGIT; anything else is ignored
                max_age = float(min(int(digits), _DELTA_MAX))
    if not (no_cache or no_store or max_age is not None):
        return NO_DIRECTIVES
    return CacheDirectives(no_cache=no_cache, no_store=no_store, max_age=max_age)


def parse_cache_control(value: bytes | None) -> CacheDirectives:
    """Parse a request ``Cache-Control`` value; never raises, unknown directives ignored.

    Several header lines must be joined with ``b", "`` first. Of repeated ``max-age``
    directives the first valid one counts (RFC 9111 §4.2.1).
    """
    if not value:
        return NO_DIRECTIVES
    directives = _parsed.get(value)
    if directives is None:
        directives = _parse(value)
        if len(value) <= _PARSED_VALUE_MAX:
            remember(_parsed, value, directives, _PARSED_MAX)
    return directives


def credential_scope(tenant: str | None, credential: bytes | None) -> str:
    """The cache scope of a caller (docs/spec.md §10): the tenant when auth knows one, else a
    digest of the client's credential that cannot be turned back into the key ("anon": none).

    >>> credential_scope("team-a", b"sk-1"), credential_scope(None, None)
    ('t:team-a', 'anon')
    """
    if tenant is not None:
        return "t:" + tenant
    if not credential:
        return "anon"
    return "k:" + hashlib.sha256(b"llm-gateway scope\0" + credential).hexdigest()[:32]
