"""A timeout over a stretch of time that keeps starting again, on one timer handle.

The gateway watches three such stretches: a client's request head and the gaps between the reads
of its body (the client guards, ``gateway/server/http1_guards.py``), each wait for an upstream's
answer (the HTTP/1.1 client's read timeout, ``gateway/transports/http1_client_connection.py``),
and the gap between two events of a stream (the SSE relay's idle timeout,
``gateway/streaming/relay.py``). Each stretch starts again far more often than it times out —
every chunk, every event, every request — and ``asyncio.timeout`` rescheduled per chunk makes
and cancels a timer handle each time (and calls ``asyncio.get_running_loop``, a ``getpid``
syscall). Here a new stretch only notes the loop time; the one timer, when it fires early, is
set again for what is left of the stretch in progress (or dropped when none is), and only a
stretch that really lasted the whole timeout calls ``on_expiry``::

    d = Deadline(loop, 30.0, on_timeout)
    d.start()      # a stretch begins (the timer is armed if it is not)
    d.touch()      # ... and begins again: no timer work
    d.end()        # no stretch now; a timer still armed finds nothing when it fires
    d.stop()       # the owner is done: the timer is cancelled

``on_expiry`` is held for the deadline's life: give it something that does not hold the
deadline's owner when the owner is made per request (a reference cycle per request is work for
the garbage collector), e.g. a method of a longer-lived object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
    __slots__ = ("_handle", "_loop", "_on_expiry", "expired", "since", "timeout")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout: float, on_expiry: Callable[[], object]
    ) -> None:
        self._loop = loop
        #: seconds a stretch may last (the owner may change it between stretches)
        self.timeout = timeout
        self._on_expiry = on_expiry
        #: loop time the stretch in progress began; None: no stretch now
        self.since: float | None = None
        #: set once a stretch expired (before ``on_expiry`` is called)
        self.expired = False
        self._handle: asyncio.TimerHandle | None = None

    def begin(self, now: float | None = None) -> None:
        """A stretch begins at ``now`` (loop time; default: the loop's now), the timer is left as
        it is: :meth:`arm` it when the stretch turns out to last (the client guards arm only
        when a read leaves a request unfinished)."""
        self.since = self._loop.time() if now is None else now

    def arm(self) -> None:
        """Arm the timer for the stretch in progress, unless it is armed already."""
        since = self.since
        if self._handle is None and since is not None:
            self._handle = self._loop.call_at(since + self.timeout, self._fire)

    def start(self, now: float | None = None) -> None:
        """A stretch begins now, with the timer armed (:meth:`begin` + :meth:`arm`)."""
        since = self.since = self._loop.time() if now is None else now
        if self._handle is None:
            self._handle = self._loop.call_at(since + self.timeout, self._fire)

    def touch(self) -> None:
        """The stretch in progress begins again now (a chunk or an event arrived)."""
        self.since = self._loop.time()

    def end(self) -> None:
        """No stretch now. The timer stays armed (cancelling and arming it again per stretch is
        the cost this class exists to avoid); when it fires it finds nothing to time out."""
        self.since = None

    def stop(self) -> None:
        """No stretch now, and no timer: the owner is done (or about to change ``timeout``)."""
        self.since = None
        handle = self._handle
        if handle is not None:
            self._handle = None
            handle.cancel()

    def _fire(self) -> None:
        self._handle = None
        since = self.since
        if since is None:
            return  # no stretch now: the next start() arms the timer again
        due = since + self.timeout
        if self._loop.time() < due:  # the stretch began again since the timer was set
            self._handle = self._loop.call_at(due, self._fire)
            return
        self.since = None
        self.expired = True
        self._on_expiry()
