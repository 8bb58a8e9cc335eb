"""The relay of one realtime session: two pumps and one close path (docs/spec.md §19).

::

    client ──receive──▶ [client pump] ──send──▶ upstream      messages_in
    client ◀──send───── [upstream pump] ◀─recv── upstream      messages_out

Each pump is a small loop with one state (relaying) and three ways out, each an :class:`End`:
its source closed (a close frame, or the connection lost), its destination refused a write, or
the session's own limits stopped it (idle, session length). Whichever pump ends first decides;
the close path then stops the other pump and closes both sides once:

==========================  ===============================  ================================
what ended it               the client gets                  the upstream gets
==========================  ===============================  ================================
the client closed (code)    (its close was echoed)           the same code and reason
the client vanished         —                                1001, within 1 s
the upstream closed (code)  the same code and reason         (its close was echoed)
the upstream vanished       1011 "upstream connection lost"  —
a message too big           1009 (by ``websockets``)         1009
idle_timeout_s              1000 "idle timeout"              1000 "idle timeout"
max_session_s               1000 "session time limit"        1000 "session time limit"
==========================  ===============================  ================================

Each message is written as soon as it is read, never batched; a pump reads the next message
only once the last one is written, so a slow reader slows its sender (the server stops reading
the client's socket while a message waits, ``websockets`` the upstream's beyond
:data:`~gateway.realtime.upstream.UPSTREAM_QUEUE` messages). Pings are answered per hop by the
libraries and never relayed. Per message, the pumps stamp where it was read and where it was
written (the per-frame overhead, ``gateway_realtime_message_overhead_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.realtime.events import Responses, event_type
from gateway.realtime.server_protocol import READ_AT
from gateway.realtime.upstream import Closed, UpstreamSocket
from gateway.types import Receive, Send

#: observes one message's overhead (seconds)
Observe = Callable[[float], None]

#: by whom a session ended
BY_CLIENT = "client"
BY_UPSTREAM = "upstream"
BY_LIMIT = "limit"


def sendable(code: int) -> bool:
    """Whether a close code may be sent in a close frame (RFC 6455 §7.4; 1005, 1006 and 1015
    only report what happened)."""
    return code in (1000, 1001, 1002, 1003) or 1007 <= code <= 1014 or 3000 <= code <= 4999


class End:
    """How a session ended."""

    __slots__ = ("by", "code", "reason")

    def __init__(self, by: str, code: int, reason: str) -> None:
        self.by = by
        #: the close code the client's side ended with (what gateway_realtime_sessions_total
        #: counts): the client's own, or the one the gateway sent it
        self.code = code
        self.reason = reason


class Stats:
    """Counters of one session, written by the pumps."""

    __slots__ = ("max_in", "max_out", "messages_in", "messages_out", "overhead_in", "overhead_out")

    def __init__(self) -> None:
        self.messages_in = 0
        self.messages_out = 0
        #: summed and largest per-message overhead (s), client→upstream and upstream→client
        self.overhead_in = self.overhead_out = 0.0
        self.max_in = self.max_out = 0.0


def _nothing(_seconds: float) -> None:
    return None


class Relay:
    __slots__ = (
        "_client_closed",
        "_idle_s",
        "_idle_timer",
        "_last",
        "_max_bytes",
        "_observe_in",
        "_observe_out",
        "_receive",
        "_responses",
        "_send",
        "_session_s",
        "_stop",
        "_up",
        "stats",
    )

    def __init__(
        self,
        receive: Receive,
        send: Send,
        upstream: UpstreamSocket,
        responses: Responses,
        *,
        max_message_bytes: int,
        idle_timeout_s: float,
        max_session_s: float,
        observe_in: Observe = _nothing,
        observe_out: Observe = _nothing,
    ) -> None:
        self._receive = receive
        self._send = send
        self._up = upstream
        self._responses = responses
        self._max_bytes = max_message_bytes
        self._idle_s = idle_timeout_s
        self._session_s = max_session_s
        self._observe_in = observe_in
        self._observe_out = observe_out
        self._last = time.perf_counter()
        self._stop: asyncio.Future[End] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: the client's side is closed already (its close echoed, or it vanished)
        self._client_closed = False
        self.stats = Stats()

    # ------------------------------------------------------------ the pumps

    async def _from_client(self) -> End:
        receive, up, stats, observe = self._receive, self._up, self.stats, self._observe_in
        responses, max_bytes = self._responses, self._max_bytes
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":  # websocket.disconnect
                code: int = message.get("code", 1005)
                return End(BY_CLIENT, code, message.get("reason") or "")
            read_at: float = message.get(READ_AT) or time.perf_counter()
            text: str | None = message.get("text")
            data: str | bytes | None = text if text is not None else message.get("bytes")
            if data is None:
                continue
            if len(data) > max_bytes:  # a server without ws_max_size: the limit holds anyway
                return End(BY_LIMIT, 1009, "message over max_message_bytes")
            try:
                await up.send(data)
            except Closed as exc:
                return _upstream_end(exc)
            written = self._last = time.perf_counter()
            stats.messages_in += 1
            overhead = written - read_at
            stats.overhead_in += overhead
            if overhead > stats.max_in:
                stats.max_in = overhead
            observe(overhead)
            if text is not None and event_type(text) == "response.create":
                responses.from_client("response.create", read_at)

    async def _from_upstream(self) -> End:
        send, up, stats, observe = self._send, self._up, self.stats, self._observe_out
        responses = self._responses
        while True:
            try:
                data = await up.recv()
            except Closed as exc:
                return _upstream_end(exc)
            read_at = up.read_at
            try:
                if type(data) is str:
                    await send({"type": "websocket.send", "text": data})
                else:
                    await send({"type": "websocket.send", "bytes": data})
            except OSError:  # uvicorn's ClientDisconnected: the client is gone
                self._client_closed = True
                return End(BY_CLIENT, 1006, "")
            written = self._last = time.perf_counter()
            stats.messages_out += 1
            overhead = written - read_at
            stats.overhead_out += overhead
            if overhead > stats.max_out:
                stats.max_out = overhead
            observe(overhead)
            if type(data) is str:
                kind = event_type(data)
                if kind is not None and kind.startswith(("response.", "input_audio_buffer.c")):
                    responses.from_upstream(kind, data, written)

    # ------------------------------------------------------------ the limits

    def _limit(self, reason: str) -> None:
        stop = self._stop
        if stop is not None and not stop.done():
            stop.set_result(End(BY_LIMIT, 1000, reason))

    def _check_idle(self) -> None:
        quiet = time.perf_counter() - self._last
        if quiet >= self._idle_s - 0.001:
            self._limit("idle timeout")
            return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(self._idle_s - quiet, self._check_idle)

    # ------------------------------------------------------------ run and close

    async def run(self) -> End:
        """Relay until one side ends (or a limit); both sides are closed on return."""
        loop = asyncio.get_running_loop()
        self._stop = stop = loop.create_future()
        self._last = time.perf_counter()
        from_up = loop.create_task(self._from_upstream())
        from_client = loop.create_task(self._from_client())
        self._idle_timer = loop.call_later(self._idle_s, self._check_idle)
        session_timer = loop.call_later(self._session_s, self._limit, "session time limit")
        try:
            await asyncio.wait((from_up, from_client, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            session_timer.cancel()
            for task in (from_up, from_client):
                task.cancel()
            ended = await asyncio.gather(from_up, from_client, return_exceptions=True)
        end = self._decide(stop, ended)
        await self._close(end)
        return end

    @staticmethod
    def _decide(stop: asyncio.Future[End], ended: Sequence[Any]) -> End:
        if stop.done():
            return stop.result()
        up_end, client_end = ended
        if isinstance(client_end, End):
            return client_end  # the client's own end is the most definite
        if isinstance(up_end, End):
            return up_end
        if isinstance(client_end, BaseException) and not isinstance(
            client_end, asyncio.CancelledError
        ):
            raise client_end
        if isinstance(up_end, BaseException):
            raise up_end
        raise AssertionError("a pump ended without an outcome")  # pragma: no cover

    async def _close(self, end: End) -> None:
        """The one close path: each side that is still open gets its close."""
        up = self._up
        if end.by == BY_CLIENT:
            # the client closed (uvicorn echoed it) or vanished: the upstream, within 1 s
            code = end.code if sendable(end.code) else 1001
            await up.close(code, end.reason if sendable(end.code) else "client went away")
            return
        if end.by == BY_UPSTREAM:
            await up.close(1000, "")  # already closed: this only releases it
            await self._close_client(end.code, end.reason)
            return
        await self._close_client(end.code, end.reason)
        await up.close(end.code, end.reason)

    async def _close_client(self, code: int, reason: str) -> None:
        if self._client_closed:
            return
        self._client_closed = True
        with contextlib.suppress(OSError, RuntimeError):  # it went away meanwhile
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


def _upstream_end(exc: Closed) -> End:
    if exc.lost:
        return End(BY_UPSTREAM, 1011, exc.reason)
    code = exc.code if sendable(exc.code) else 1000
    return End(BY_UPSTREAM, code, exc.reason)


__all__ = ["BY_CLIENT", "BY_LIMIT", "BY_UPSTREAM", "End", "Relay", "Stats", "sendable"]
