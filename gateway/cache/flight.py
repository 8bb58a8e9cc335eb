"""Single flight inside one process: identical cacheable requests make one upstream call.

The first request for a key leads; later ones follow its :class:`Flight`. A follower of a
streaming leader tails the leader's events live (same content, same pace); any other follower
waits for the leader's finished entry. When the leader ends without a storable answer
(error, cut stream), followers that have received nothing yet go upstream themselves, and a
tailing follower that already got events gets the leader's error event: never a silent loss.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.cache.replay import Entry

#: kinds of published events
CONTENT = 0
USAGE_ONLY = 1  # a chunk with choices == [] (sent only to followers that asked for usage)
DONE = 2


class Flight:
    __slots__ = ("_wake", "entry", "error_event", "events", "finished", "streaming")

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.events: list[tuple[int, bytes]] = []
        self.finished = False
        self.entry: Entry | None = None
        #: the SSE error event the leader ended with, when its stream was cut
        self.error_event: bytes | None = None
        #: made when someone first waits (most flights have no follower): a leader with no
        #: follower creates no future at all, however many events it publishes
        self._wake: asyncio.Future[None] | None = None

    def _notify(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _next(self) -> asyncio.Future[None]:
        """What the next publish or the finish resolves."""
        wake = self._wake
        if wake is None:
            wake = self._wake = asyncio.get_running_loop().create_future()
        return wake

    def publish(self, kind: int, raw: bytes) -> None:
        self.events.append((kind, raw))
        if self._wake is not None:
            self._notify()

    def finish(self, entry: Entry | None, error_event: bytes | None = None) -> None:
        self.entry = entry
        self.error_event = error_event
        self.finished = True
        self._notify()

    async def changed(self) -> None:
        """Until the next publish or the finish."""
        await asyncio.shield(self._next())

    async def wait(self) -> Entry | None:
        while not self.finished:
            await asyncio.shield(self._next())
        return self.entry

    async def tail(self) -> AsyncIterator[tuple[int, bytes]]:
        """The leader's events as they are published, until it finishes."""
        i = 0
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.finished:
                return
            await asyncio.shield(self._next())


class Flights:
    """Key -> the flight in progress (per process, per event loop)."""

    def __init__(self) -> None:
        self._by_key: dict[str, Flight] = {}

    def get(self, key: str) -> Flight | None:
        return self._by_key.get(key)

    def lead(self, key: str, streaming: bool) -> Flight:
        flight = Flight(streaming)
        self._by_key[key] = flight
        return flight

    def end(self, key: str, flight: Flight) -> None:
        if self._by_key.get(key) is flight:
            del self._by_key[key]

    def __len__(self) -> int:
        return len(self._by_key)
