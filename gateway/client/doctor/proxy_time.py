"""The ``proxy`` row: the ``Server-Timing`` of the answers (its ``gateway`` and ``upstream``
entries): the time the proxy itself adds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from gateway.client.doctor.report import Check, judge
from gateway.client.doctor.timed_client import TimedAnswer

__all__ = ["check_proxy", "server_timing"]

#: Server-Timing entry names read as "time in the proxy" / "time in the upstream"
_PROXY_ENTRIES: Final = ("gateway", "proxy", "overhead")
_UPSTREAM_ENTRIES: Final = ("upstream", "origin", "backend")


def server_timing(value: str) -> dict[str, float]:
    """``name;dur=1.5;desc="x", other`` → ``{"name": 1.5}`` (entries without dur are left out).

    >>> server_timing('cache;desc=miss, upstream;dur=12.5, gateway;dur=0.8')
    {'upstream': 12.5, 'gateway': 0.8}
    """
    out: dict[str, float] = {}
    for entry in _split_outside_quotes(value, ","):
        name, *params = (p.strip() for p in _split_outside_quotes(entry, ";"))
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):
                    out[name.lower()] = float(raw.strip().strip('"'))
    return out


def _split_outside_quotes(text: str, sep: str) -> Iterator[str]:
    start, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def check_proxy(answers: Sequence[TimedAnswer], th: Mapping[str, float]) -> Check:
    limit = th["proxy"]
    headers = [a.headers.get("server-timing") for a in answers if a.ok]
    present = [h for h in headers if h]
    if not present:
        detail = "no Server-Timing header: the target does not report proxy time"
        return Check("proxy", None, "ms", limit, "skip", "", detail)
    for header in present:
        entries = server_timing(header)
        proxy_name = next((n for n in _PROXY_ENTRIES if n in entries), None)
        if proxy_name is None:
            continue
        proxy = entries[proxy_name]
        detail = f"{proxy_name} {proxy:.1f} ms"
        upstream_name = next((n for n in _UPSTREAM_ENTRIES if n in entries), None)
        if upstream_name is not None:
            detail += f", {upstream_name} {entries[upstream_name]:.1f} ms"
        detail += " (Server-Timing)"
        hint = (
            "the proxy itself adds the time: read its hops (auth, router, cache) in "
            "Server-Timing or its traces; a slow cache store, a new upstream connection per request"
        )
        return judge("proxy", proxy, limit, detail, hint)
    detail = f"Server-Timing has no gateway/upstream entries: {present[0][:80]}"
    return Check("proxy", None, "ms", limit, "skip", "", detail)
