"""Edge hop intervals and the ``Server-Timing`` header, both read off the Timeline (docs/spec.md
§6).

>>> format_metric("auth", 0.0123)
'auth;dur=12.300'
"""

from __future__ import annotations

import time

from gateway.context import RequestContext

EdgeInterval = tuple[str, int, float, float]  # (hop name, hop.index, start, end) epoch seconds


def edge_intervals(ctx: RequestContext) -> list[EdgeInterval]:
    """Hop i lasts from its time to hop i+1's; the last edge hop ends at ``received``.

    Only headers the edge accepted (trusted peer, not future, not stale) are here; an
    out-of-order time (clock skew between proxies) yields a zero-length hop, never a negative.
    """
    times = ctx.edge_times
    if not times:
        return []
    received = ctx.timeline.wall_ns / 1e9
    out: list[EdgeInterval] = []
    for i, (name, index, at) in enumerate(times):
        end = times[i + 1][2] if i + 1 < len(times) else received
        end = min(end, received)
        out.append((name, index, min(at, end), end))
    return out


def format_metric(name: str, seconds: float) -> str:
    return f"{name};dur={seconds * 1000:.3f}"


def server_timing(ctx: RequestContext, edges: list[EdgeInterval]) -> bytes:
    """``cdn;dur=…, lb;dur=…, intake;dur=…, auth;dur=…, router;dur=…, cache;desc=…,
    upstream;dur=…, backoff;dur=…, gateway;dur=…`` with the values known now (the headers are
    going out). ``backoff`` only when the request waited between attempts; ``gateway`` is the
    gateway's own time: request - upstream - backoff (docs/spec.md §6)."""
    t = ctx.timeline
    now = time.perf_counter()
    intake = t.intake_done
    auth = t.auth_done
    routed = t.routed
    attempts = ctx.attempts
    if not edges and routed is not None and auth is not None:
        if len(attempts) == 1:
            # the common answer, one format: routed, one attempt (so no backoff), no edge hops
            a = attempts[0]
            upstream = (a.end if a.end is not None else now) - a.start
            return (
                f"intake;dur={(intake - t.received) * 1000:.3f}"
                f", auth;dur={(auth - intake) * 1000:.3f}"
                f", router;dur={(routed - auth) * 1000:.3f}, cache;desc={ctx.cache.result}"
                f", upstream;dur={upstream * 1000:.3f}"
                f", gateway;dur={max(0.0, (now - t.received) - upstream - t.backoff) * 1000:.3f}"
            ).encode()
        if not attempts:  # a cache hit: routed, no upstream
            return (
                f"intake;dur={(intake - t.received) * 1000:.3f}"
                f", auth;dur={(auth - intake) * 1000:.3f}"
                f", router;dur={(routed - auth) * 1000:.3f}, cache;desc={ctx.cache.result}"
                f", gateway;dur={(now - t.received) * 1000:.3f}"
            ).encode()
    return _general(ctx, edges, now)


def _general(ctx: RequestContext, edges: list[EdgeInterval], now: float) -> bytes:
    """What :func:`server_timing` writes for any request (the one format each for the common
    answer and a cache hit above write the same)."""
    t = ctx.timeline
    parts = [format_metric(name, end - start) for name, _, start, end in edges] if edges else []
    intake = t.intake_done
    parts.append(f"intake;dur={(intake - t.received) * 1000:.3f}")
    auth = t.auth_done
    if auth is not None:
        routed = t.routed
        if routed is not None:
            a_ms, r_ms = (auth - intake) * 1000, (routed - auth) * 1000
            parts.append(f"auth;dur={a_ms:.3f}, router;dur={r_ms:.3f}")
        else:
            parts.append(f"auth;dur={(auth - intake) * 1000:.3f}")
    parts.append("cache;desc=" + ctx.cache.result)
    if ctx.attempts:
        upstream = ctx.upstream_time(now)
        backoff = t.backoff
        gateway = max(0.0, (now - t.received) - upstream - backoff)
        parts.append(f"upstream;dur={upstream * 1000:.3f}")
        if backoff:
            parts.append(f"backoff;dur={backoff * 1000:.3f}")
        parts.append(f"gateway;dur={gateway * 1000:.3f}")
    else:
        parts.append(f"gateway;dur={(now - t.received) * 1000:.3f}")
    return ", ".join(parts).encode()
