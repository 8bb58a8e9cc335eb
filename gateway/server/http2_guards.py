"""The guards of an HTTP/2 connection: what one client may make the gateway do, and for how long
(docs/spec.md §27, ``[server.http2]``) — the attacks on HTTP/2 servers of the last years, each
bounded where nginx and Envoy bound it after their advisories.

:class:`Http2Guards` is the half of :class:`~gateway.server.http2.Http2Protocol` that walks the
frame headers of every read *before* ``h2`` parses it (:meth:`Http2Guards.scan`: nine bytes a
frame, the payload skipped), so a flood is cut where it is seen, not after ``h2`` has queued an
answer to each frame of it:

- **CONTINUATION** (CVE-2024-27316 and its kin): a header block (HEADERS and its CONTINUATION
  frames) holds at most ``max_continuation_frames`` CONTINUATIONs and, compressed, at most
  ``max_header_list_bytes`` (the decoded list's own limit: a block within it compresses to
  less); it must end within ``client_header_timeout_s``;
- **Rapid Reset** (CVE-2023-44487): each RST_STREAM from the client, and each stream the gateway
  refuses, takes a token of a bucket of ``reset_burst`` refilled at ``resets_per_s``;
- **SETTINGS, PING, PRIORITY, empty-DATA, unknown-frame floods** (CVE-2019-9512, -9515, -9516,
  -9518) and **WINDOW_UPDATE floods**: each such frame takes a token of a bucket of
  ``control_frame_burst`` refilled at ``control_frames_per_s``; a WINDOW_UPDATE is free while
  the gateway has sent DATA it answers (two per DATA frame: the stream's and the connection's);

an empty bucket, or a block over its bounds, ends the connection: GOAWAY ENHANCE_YOUR_CALM, the
streams in flight see their client go away (499), the socket is closed (aborted after
``linger_s`` if the client does not read). The header list's decoded size is ``h2``'s (HPACK's
decoder counts 32 octets per field, RFC 9113 §6.5.2): over ``max_header_list_bytes`` is a
connection error too (a block decoded halfway leaves the HPACK state unusable).

Time, on one :class:`~gateway.deadline.Deadline` each: the preface and the client's first
SETTINGS are due ``client_header_timeout_s`` after the accept; a connection with no stream open
for ``idle_timeout_s`` is closed with GOAWAY NO_ERROR (never silently: a client that reuses it
knows). A sweep every second, armed only while a stream waits, resets an answer stalled at a
zero window for ``stalled_stream_timeout_s`` and answers 408 to a request body with no DATA for
``client_body_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import H2Error
from hyperframe.frame import GoAwayFrame

from gateway.config import Http2Config
from gateway.deadline import Deadline
from gateway.server.http2_stream import Stream, response_head
from gateway.server.intake import Lingering, refusal
from gateway.server.state import ClientLimits

log = logging.getLogger("gateway")

__all__ = ["Bucket", "Http2Guards"]

#: the client's connection preface (RFC 9113 §3.4), which ``h2`` checks
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: frame types (RFC 9113 §6)
_DATA, _HEADERS, _PRIORITY, _RST, _SETTINGS, _PUSH, _PING, _GOAWAY, _WINDOW, _CONT = range(10)
_END_STREAM = 0x1
_END_HEADERS = 0x4
#: WINDOW_UPDATEs a connection may send before the gateway sent any DATA (its first ones)
_WINDOW_CREDIT = 16
_WINDOW_CREDIT_MAX = 1 << 16
#: how often the sweep looks at waiting streams
SWEEP_S = 1.0
_BODY_408 = refusal(408, "client_body_timeout", "no request body bytes arrived in time")


class Bucket:
    """A token bucket: ``burst`` tokens, refilled at ``rate`` a second."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at: float | None = None

    def take(self, now: float) -> bool:
        """One token at loop time ``now``: False when there was none left."""
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= 1.0
        return self.tokens >= 0.0


class Http2Guards(asyncio.Protocol):
    """The half of :class:`~gateway.server.http2.Http2Protocol` that bounds what its client may
    do (see the module)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    h2: H2Connection
    limits: Http2Config
    client_limits: ClientLimits
    client: tuple[str, int] | None
    streams: dict[int, Stream]
    #: GOAWAY went out naming this last stream (streams above it are refused)
    goaway_last: int | None

    def _guards(self) -> None:
        limits = self.limits
        #: bytes of the frame in progress still to skip (the preface first)
        self._skip = len(PREFACE)
        #: a frame header split between two reads
        self._partial = b""
        #: the header block in progress: its compressed bytes and CONTINUATIONs (-1: none)
        self._block = -1
        self._continuations = 0
        self._resets = Bucket(limits.resets_per_s, limits.reset_burst)
        self._control = Bucket(limits.control_frames_per_s, limits.control_frame_burst)
        self._window_credit = _WINDOW_CREDIT
        self._settings_seen = False
        self._guard = Deadline(self.loop, self.client_limits.header_timeout_s, self._guard_expired)
        self._idle = Deadline(self.loop, limits.idle_timeout_s, self._idle_expired)
        self._sweep: asyncio.TimerHandle | None = None
        self._abort: asyncio.TimerHandle | None = None
        self._guard.start()
        self._idle.start()

    def _stop_guards(self) -> None:
        self._guard.stop()
        self._idle.stop()
        if self._abort is not None:
            self._abort.cancel()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    # ------------------------------------------------------------ the frames, before h2

    def scan(self, data: bytes) -> str | None:
        """Walk the frame headers of one read: why the connection must end, or None."""
        n = len(data)
        i = min(self._skip, n)
        self._skip -= i
        partial = self._partial
        while i < n:
            if partial:
                take = 9 - len(partial)
                partial += data[i : i + take]
                i += take
                if len(partial) < 9:
                    break
                header, at, partial = partial, 0, b""
            elif n - i < 9:
                partial = data[i:]
                break
            else:
                header, at = data, i
                i += 9
            length = int.from_bytes(header[at : at + 3], "big")
            left = n - i
            if length > left:
                self._skip = length - left
                i = n
            else:
                i += length
            why = self._frame(header[at + 3], header[at + 4], length)
            if why is not None:
                return why
        self._partial = partial
        return None

    def _frame(self, kind: int, flags: int, length: int) -> str | None:
        if kind == _DATA:
            if length or flags & _END_STREAM:
                return None
            return self._flood("empty DATA frames")
        if kind == _HEADERS:
            if not flags & _END_HEADERS:
                self._block = length
                self._continuations = 0
                self._guard.start()  # the block must end within the head's timeout
            return None
        if kind == _CONT:
            return self._continuation(flags, length)
        if kind == _WINDOW:
            if self._window_credit > 0:
                self._window_credit -= 1
                return None
            return self._flood("WINDOW_UPDATE frames")
        if kind == _RST:
            return self.reset_taken()
        if kind == _SETTINGS and not self._settings_seen:
            self._settings_seen = True  # the preface's own SETTINGS: the connection is up
            self._guard.end()
            return None
        if kind in (_SETTINGS, _PING, _PRIORITY) or kind > _CONT:
            return self._flood("control frames")
        return None  # GOAWAY (the client ends), PUSH_PROMISE (``h2`` refuses it)

    def _continuation(self, flags: int, length: int) -> str | None:
        if self._block < 0:
            return None  # a CONTINUATION outside a block: ``h2`` refuses it
        self._continuations += 1
        self._block += length
        limits = self.limits
        if self._continuations > limits.max_continuation_frames:
            return "a header block of too many CONTINUATION frames"
        if self._block > limits.max_header_list_bytes:
            return "a header block over max_header_list_bytes"
        if flags & _END_HEADERS:
            self._block = -1
            self._guard.end()
        return None

    def _flood(self, what: str) -> str | None:
        if self._control.take(self.loop.time()):
            return None
        return f"a flood of {what}"

    def reset_taken(self) -> str | None:
        """A client reset (or a stream refused): a token of the reset bucket."""
        if self._resets.take(self.loop.time()):
            return None
        return "too many stream resets (rapid reset)"

    def credit_window_updates(self) -> None:
        """A DATA frame went out: the client may answer it with two WINDOW_UPDATEs."""
        credit = self._window_credit + 2
        self._window_credit = credit if credit < _WINDOW_CREDIT_MAX else _WINDOW_CREDIT_MAX

    # ------------------------------------------------------------ ending the connection

    def goaway(self, code: int, debug: bytes) -> None:
        """GOAWAY naming the last stream the gateway took (RFC 9113 §6.8): streams above it are
        refused from now on. Written past ``h2``'s state machine, which would take a GOAWAY as
        the end of every stream."""
        last = self.h2.highest_inbound_stream_id
        if self.goaway_last is not None:
            last = min(last, self.goaway_last)
        self.goaway_last = last
        self.flush()
        if not self.transport.is_closing():
            frame = GoAwayFrame(0, last_stream_id=last, error_code=code, additional_data=debug)
            self.transport.write(frame.serialize())

    def fatal(self, why: str, code: int = ErrorCodes.ENHANCE_YOUR_CALM) -> None:
        """End the connection now, for ``why``: GOAWAY ``code``, every stream gone (499)."""
        if not self.transport.is_closing():
            log.info(f"gateway: HTTP/2 connection from {_peer(self.client)} ended: {why}")
            self.end(code, why.encode()[:100])

    def end(self, code: int, debug: bytes) -> None:
        """GOAWAY, then a lingering close (as HTTP/1.1's): the socket half-closed, what the
        client still sends read and dropped, aborted after ``linger_s``. Closing with bytes
        unread would reset the connection, and a reset can destroy the GOAWAY in the client's
        buffers before it is read."""
        transport = self.transport
        if transport.is_closing():
            return
        self.goaway(code, debug)
        lingering = Lingering(transport, self.client_limits.linger_s)
        transport.set_protocol(lingering)
        self.connection_lost(None)
        lingering.start(False)

    def close(self) -> None:
        """Close after what is written (every stream left sees its client go away); a client
        that does not read it is cut after ``linger_s``."""
        for stream in list(self.streams.values()):
            stream.lost()
        transport = self.transport
        if not transport.is_closing():
            self.flush()
            transport.close()
            self._abort = self.loop.call_later(self.client_limits.linger_s, transport.abort)

    def flush(self) -> None:
        """Write what ``h2`` holds."""

    # ------------------------------------------------------------ time

    def _guard_expired(self) -> None:
        what = "a header block" if self._block >= 0 else "the connection preface"
        timeout = self._guard.timeout
        self.fatal(f"{what} did not arrive within {timeout:g} s", ErrorCodes.NO_ERROR)

    def _idle_expired(self) -> None:
        if not self.streams:
            self.end(ErrorCodes.NO_ERROR, b"idle_timeout")

    def watch(self) -> None:
        """A stream began to wait for the client: the sweep runs while any does."""
        if self._sweep is None and not self.transport.is_closing():
            self._sweep = self.loop.call_later(SWEEP_S, self._swept)

    def _swept(self) -> None:
        self._sweep = None
        now = self.loop.time()
        stalled = self.limits.stalled_stream_timeout_s
        body_timeout = self.client_limits.body_timeout_s
        waiting = False
        for stream in list(self.streams.values()):
            if stream.disconnected:
                continue
            since = stream.blocked_since
            if since is not None:
                if now - since >= stalled:
                    self._reap(stream, f"no window for {stalled:g} s")
                    continue
                waiting = True
            if stream.reading:
                if now - stream.last_read >= body_timeout:
                    if stream.response_started:
                        self._reap(stream, "no request body bytes in time")
                    else:
                        _answer_408(self.h2, stream, self.date())
                        self.flush()
                    continue
                waiting = True
        if waiting:
            self.watch()

    def _reap(self, stream: Stream, why: str) -> None:
        """An answer stalled at a zero window: the stream is reset, its request sees the client
        go away (499)."""
        log.info(f"gateway: HTTP/2 stream {stream.id} from {_peer(self.client)} reset: {why}")
        with contextlib.suppress(H2Error):
            self.h2.reset_stream(stream.id, ErrorCodes.CANCEL)
        stream.lost()
        self.flush()

    def date(self) -> bytes:
        """The server's ``date`` line."""
        raise NotImplementedError


def _answer_408(h2: H2Connection, stream: Stream, date: bytes) -> None:
    """No body DATA for ``client_body_timeout_s`` while the app waited, and its answer has not
    started: 408, then RST_STREAM NO_ERROR for the rest of the body (RFC 9113 §8.1); the
    request sees the client go away (499)."""
    stream.lost()
    answer = _BODY_408
    headers = [*answer.headers, (b"content-length", str(len(answer.body)).encode())]
    try:
        h2.send_headers(stream.id, response_head(answer.status, headers, date, None))
        if h2.local_flow_control_window(stream.id) >= len(answer.body):
            h2.send_data(stream.id, answer.body, end_stream=True)
        h2.reset_stream(stream.id, ErrorCodes.NO_ERROR)
    except H2Error:
        pass


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
