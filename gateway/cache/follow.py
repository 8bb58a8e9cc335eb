"""Followers of single flight (docs/spec.md §10): what a request gets from an identical one in
flight.

A follower of a streaming leader tails the leader's events live (same content, same pace);
any other follower waits for the leader's finished entry. When the leader ends with nothing to
share, :func:`source` returns None and the follower asks the upstream itself; a tailing follower
that already got events gets the leader's error event instead: never a silent loss.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from gateway.cache.flight import CONTENT, Flight
from gateway.cache.replay import DONE_EVENT, Entry, usage_event
from gateway.errors import UpstreamStreamError

if TYPE_CHECKING:
    from gateway.cache.service import ResponseCache
    from gateway.context import Call, RequestContext

SHARED_CUT = "the upstream stream this answer was shared with was cut"


async def source(
    cache: ResponseCache, ctx: RequestContext, call: Call, flight: Flight
) -> Entry | Flight | None:
    """The leader's entry (replay it), the leader's live flight (tail it), or None."""
    if call.stream and flight.streaming:
        if await _first_event_or_end(flight):  # the leader is streaming: tail it live
            cache.followed(ctx, None)
            return flight
        return None
    entry = await flight.wait()
    if entry is None:
        return None
    cache.followed(ctx, entry)
    return entry


async def _first_event_or_end(flight: Flight) -> bool:
    """Wait until the leader publishes an event (True) or finishes without any (False)."""
    while not flight.events and not flight.finished:
        await flight.changed()
    return bool(flight.events)


async def tail_events(flight: Flight, include_usage: bool) -> AsyncIterator[bytes]:
    """A follower's copy of the leader's live stream, with its own usage/[DONE] ending."""
    async for kind, raw in flight.tail():
        if kind == CONTENT:
            yield raw
    if flight.entry is not None:
        if include_usage:
            usage = usage_event(flight.entry)
            if usage is not None:
                yield usage
        yield DONE_EVENT
    elif flight.error_event is not None:
        yield flight.error_event
    else:
        yield UpstreamStreamError(SHARED_CUT).sse_event()
