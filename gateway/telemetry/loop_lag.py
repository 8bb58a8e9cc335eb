"""The event loop's lag (docs/spec.md §7, §11; docs/architecture.md, "The Timeline").

Every socket stamp of a request is taken when the event loop runs the callback that read the
bytes, not when they arrived: while the loop is busy with something else (another request's
work, a synchronous call, a garbage collection) an answer that is already in the socket waits,
and that wait lands in "upstream" (or in whichever interval the late callback closes). The lag
says how much of that there was.

:class:`LoopLag` is a callback the loop is asked to run every :data:`INTERVAL_S`; how late it runs
is the loop's lag. Each reading goes into ``gateway_event_loop_lag_seconds`` and into a small
ring, and a finished request reads the largest lag of the readings taken while it ran (plus how
late the pending reading already is) as its root span's ``gateway.event_loop.lag_ms``. Nothing
runs per request but that read; a busy stretch shorter than the interval can fall between two
readings (it is then seen only if it holds a reading back), one longer than it never does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from gateway.telemetry.metrics import Histogram

#: how often the loop is asked to run the monitor
INTERVAL_S: Final = 0.1
#: readings kept for the requests that ask (6.4 s at the interval)
KEEP: Final = 64


class LoopLag:
    """How late the event loop runs a callback due every ``interval`` seconds."""

    __slots__ = ("_at", "_due", "_handle", "_lags", "_next", "histogram", "interval", "loop")

    def __init__(self, histogram: Histogram | None = None, interval: float = INTERVAL_S) -> None:
        #: ``gateway_event_loop_lag_seconds`` (None without metrics)
        self.histogram = histogram
        self.interval = interval
        #: the loop watched (set by :meth:`start`)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        #: ``time.perf_counter()`` when the pending reading is due
        self._due = 0.0
        #: the ring of readings: when each ran (perf_counter) and how late it was
        self._at = [float("-inf")] * KEEP
        self._lags = [0.0] * KEEP
        self._next = 0

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._schedule(self.loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = time.perf_counter() + self.interval
        self._handle = loop.call_later(self.interval, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.perf_counter()
        # uvloop's timers have millisecond resolution: one may run a little early
        lag = max(now - self._due, 0.0)
        i = self._next
        self._at[i] = now
        self._lags[i] = lag
        self._next = (i + 1) % KEEP
        if self.histogram is not None:
            self.histogram.observe((), lag)
        self._schedule(loop)

    def worst_since(self, start: float) -> float | None:
        """The largest lag read since ``start`` (``time.perf_counter()``; the last :data:`KEEP`
        readings at most), the pending reading's lateness so far included; None when the monitor
        is not running."""
        if self._handle is None:
            return None
        worst = max(time.perf_counter() - self._due, 0.0)
        at, lags = self._at, self._lags
        i = self._next
        for _ in range(KEEP):
            i = i - 1 if i else KEEP - 1
            if at[i] < start:
                break
            if lags[i] > worst:
                worst = lags[i]
        return worst


__all__ = ["INTERVAL_S", "LoopLag"]
