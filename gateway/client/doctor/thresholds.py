"""The doctor's thresholds (docs/spec.md §17) and ``--threshold name=value`` overrides.

Above a threshold a row warns; what fails is stated per check (errors, a buffered stream, no
[DONE], a new connection per request).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

__all__ = ["DEFAULT_THRESHOLDS", "parse_thresholds"]

#: a cached or nearby resolver answers in a few ms; 300 ms is a resolver miss over a slow path,
#: paid again by every client that does not keep its connections
DNS_MS: Final = 300.0
#: the TCP handshake is one round trip; a second is a far-away or lossy link (Linux retransmits
#: a lost SYN after 1 s, so a connect over 1 s usually means a lost packet)
CONNECT_MS: Final = 1000.0
#: TLS 1.3 adds one round trip to the connect; over 200 ms is TLS 1.2's two round trips on a long
#: path, an overloaded terminator, or OCSP/CRL fetching on the server side
TLS_MS: Final = 200.0
#: a non-streamed answer arrives only after the whole generation; past ~2 s a person waiting
#: notices (and most chat UIs stream for that reason)
TTFB_MS: Final = 2000.0
#: the same 2 s for the first token of a stream (the wait a user sees before text appears)
TTFT_MS: Final = 2000.0
#: a proxy's own work (auth, routing, a cache lookup) costs a few ms; 30 ms means it does
#: something slow per request (a remote lookup, a new upstream connection, synchronous logging)
PROXY_MS: Final = 30.0
#: "bunched" needs a wait a person notices before the first event; it also keeps an instant
#: backend (a mock, a cache replay), whose events all arrive at once after ~0 ms, from being judged
BUNCH_WAIT_MS: Final = 100.0
#: ...and all events inside this fraction of that wait: a live stream spreads its events over the
#: generation (24+ tokens at up to ~1000 tokens/s take 24+ ms), a buffered one releases them in
#: one or two reads
BUNCH_RATIO: Final = 0.1

DEFAULT_THRESHOLDS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "dns": DNS_MS,
        "connect": CONNECT_MS,
        "tls": TLS_MS,
        "ttfb": TTFB_MS,
        "streaming": TTFT_MS,
        "proxy": PROXY_MS,
        "bunch_wait": BUNCH_WAIT_MS,
        "bunch_ratio": BUNCH_RATIO,
    }
)
#: other names people will try for the same thresholds
_ALIASES: Final = MappingProxyType({"ttft": "streaming", "gateway": "proxy"})


def parse_thresholds(items: Sequence[str]) -> dict[str, float]:
    """The defaults with ``name=value`` overrides applied (``ValueError`` names the bad one)."""
    out = dict(DEFAULT_THRESHOLDS)
    for item in items:
        name, sep, raw = item.partition("=")
        name = _ALIASES.get(name.strip(), name.strip())
        if not sep or name not in out:
            known = ", ".join([*DEFAULT_THRESHOLDS, *_ALIASES])
            raise ValueError(f"--threshold {item!r}: expected NAME=VALUE with NAME one of {known}")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--threshold {item!r}: {raw!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--threshold {item!r}: must be a number >= 0")
        out[name] = value
    return out
