"""Accept-Encoding negotiation (RFC 9110 §12.5.3): which coding to answer with, and whether a
client accepts a coding an upstream already applied. Parsed values are remembered (bounded)."""

from __future__ import annotations

from typing import Final

from gateway.encoding.codings import _ALIASES
from gateway.memo import remember

#: the codings we produce, in server preference order (used to break q ties)
_PRODUCED: Final = ("br", "zstd", "gzip", "identity")
#: RFC 9110 §5.6.2 tchar: a coding is a token
_TCHAR: Final = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_OWS: Final = b" \t"
_CACHE_MAX: Final = 1024
#: longer header values are parsed every time rather than cached, so the cache stays small
_CACHEABLE_LEN: Final = 256


class _Preferences:
    """One Accept-Encoding value, parsed: q-values in thousandths (exact comparisons)."""

    __slots__ = ("best", "explicit", "star")

    def __init__(self, explicit: dict[str, int], star: int | None) -> None:
        self.explicit = explicit
        self.star = star
        best: str | None = None
        best_q = 0
        for coding in _PRODUCED:  # strict ">" keeps the preferred coding on ties
            q = self.q(coding)
            if q > best_q:
                best, best_q = coding, q
        self.best = best

    def q(self, coding: str) -> int:
        q = self.explicit.get(coding)
        if q is not None:
            return q
        if self.star is not None:  # "*" matches any coding not listed, identity included
            return self.star
        # Identity is acceptable unless excluded (identity;q=0 or *;q=0), but as the fallback:
        # the lowest weight, so any listed coding we produce beats it ("gzip;q=0.5" means gzip).
        return 1 if coding == "identity" else 0


def _qvalue(value: bytes) -> int | None:
    """RFC 9110 §12.4.2 ``qvalue`` in thousandths, or None when malformed."""
    if not 1 <= len(value) <= 5 or value[:1] not in (b"0", b"1"):
        return None
    if len(value) == 1:
        return 1000 if value == b"1" else 0
    if value[1:2] != b".":
        return None
    frac = value[2:]
    if frac and not frac.isdigit():  # bytes.isdigit: ASCII digits only
        return None
    if value[:1] == b"1":
        return 1000 if not frac.strip(b"0") else None
    return int(frac.ljust(3, b"0")) if frac else 0


def _parse(value: bytes) -> _Preferences:
    explicit: dict[str, int] = {}
    star: int | None = None
    for element in value.split(b","):
        token, _, params = element.partition(b";")
        token = token.strip(_OWS).lower()
        if not token or token.translate(None, _TCHAR):
            continue  # empty list element, or not a token: ignored
        q: int | None = 1000
        if params:
            for param in params.split(b";"):
                name, eq, raw = param.partition(b"=")
                if name.strip(_OWS).lower() == b"q":
                    q = _qvalue(raw.strip(_OWS)) if eq else None
                    if q is None:
                        break
                # other parameters are not in the grammar; tolerated and ignored
        if q is None:
            continue  # malformed weight: the element is ignored, not the header
        coding = token.decode("ascii")
        coding = _ALIASES.get(coding, coding)
        # a coding listed twice: the lower weight wins (an explicit refusal is honoured, and the
        # answer does not depend on the order of the elements)
        if coding == "*":
            star = q if star is None else min(star, q)
        else:
            explicit[coding] = min(q, explicit.get(coding, q))
    return _Preferences(explicit, star)


#: No header: RFC 9110 would allow any coding, but we never guess that a client can decode one.
_ABSENT: Final = _parse(b"")
_PREFERENCES: dict[bytes, _Preferences] = {}
_ACCEPTS: dict[tuple[bytes | None, str | bytes], bool] = {}


def _preferences(accept_encoding: bytes | None) -> _Preferences:
    if accept_encoding is None:
        return _ABSENT
    prefs = _PREFERENCES.get(accept_encoding)
    if prefs is None:
        prefs = _parse(accept_encoding)
        if len(accept_encoding) <= _CACHEABLE_LEN:
            remember(_PREFERENCES, accept_encoding, prefs, _CACHE_MAX)
    return prefs


def negotiate(accept_encoding: bytes | None) -> str | None:
    """The coding to answer with: ``"br"``, ``"zstd"``, ``"gzip"``, ``"identity"``, or None.

    None means nothing we can produce is acceptable (the gateway answers 406). An absent header
    gives ``"identity"``; so does an empty one (RFC 9110: "does not want any content coding").

    >>> negotiate(b"gzip, deflate, br, zstd"), negotiate(b"gzip;q=1, br;q=0.5")
    ('br', 'gzip')
    >>> negotiate(None), negotiate(b"deflate"), negotiate(b"identity;q=0, deflate")
    ('identity', 'identity', None)
    """
    return _preferences(accept_encoding).best


def accepts(accept_encoding: bytes | None, coding: str | bytes) -> bool:
    """Whether the client accepts ``coding`` (e.g. an upstream's Content-Encoding, to pass an
    already encoded body through untouched). A list (``"gzip, br"``) needs every coding in it.

    >>> accepts(b"gzip, deflate", "deflate"), accepts(b"gzip", "br"), accepts(None, "gzip")
    (True, False, False)
    """
    key = (accept_encoding, coding)
    hit = _ACCEPTS.get(key)
    if hit is None:
        prefs = _preferences(accept_encoding)
        text = coding.decode("latin-1") if isinstance(coding, bytes) else coding
        names = [n.strip(" \t").lower() for n in text.split(",")]
        names = [_ALIASES.get(n, n) for n in names if n]
        hit = all(prefs.q(n) > 0 for n in names or ["identity"])
        if len(accept_encoding or b"") + len(coding) <= _CACHEABLE_LEN:
            remember(_ACCEPTS, key, hit, _CACHE_MAX)
    return hit
