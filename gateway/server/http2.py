"""The gateway's HTTP/2 server protocol (RFC 9113): an asyncio protocol on the sans-I/O ``h2``
state machine, serving each stream as one ASGI ``http`` request (``http_version`` ``"2"``).

:mod:`gateway.server.connections` hands it a connection whose TLS handshake chose ``h2`` by ALPN,
or a cleartext one that opened with the HTTP/2 preface (``[server] h2c``). One
:class:`Http2Protocol` per connection, built with the
:class:`~gateway.server.state.ServerState` all connections of the process share::

    read ─▶ the guards' frame walk (floods, header blocks) ─▶ h2.receive_data ─▶ events:
        RequestReceived ─▶ the ``received`` stamp of that read, gateway/server/intake.py's
                           rules ─▶ Stream ─▶ the app's task (or the server's own answer)
        DataReceived / StreamEnded ─▶ the stream's ``receive()``
        WindowUpdated / RemoteSettingsChanged ─▶ streams waiting to send wake up
        StreamReset ─▶ the stream's client is gone (499)
    ─▶ what h2 has to send (SETTINGS and PING acknowledgements, WINDOW_UPDATEs) in one write

Every answer's frames are written at the end of the event-loop step they were made in, all the
streams' together: a whole answer is one write, an SSE event leaves as soon as it is sent.

The connection's parts, each in its module: this one (the transport's side, the streams'
lifecycle, GOAWAY on SIGTERM and at ``max_requests_per_connection``), the guards
(:mod:`gateway.server.http2_guards`: the attacks, the timeouts) and the stream
(:mod:`gateway.server.http2_stream`: one request's ASGI ``receive``/``send``, flow control).

**Streams.** At most ``max_concurrent_streams`` at once (SETTINGS_MAX_CONCURRENT_STREAMS),
counting a stream until its request's task is done — a stream the client reset still holds its
slot while its task winds down, so resets cannot make the gateway run more requests than that
(the Rapid Reset fix); a stream beyond is refused (RST_STREAM REFUSED_STREAM, which a client
may retry).

**GOAWAY when nothing is in flight.** SIGTERM (``shutdown()``) and the
``max_requests_per_connection``-th stream end the connection at the first moment no stream is
in flight — at once when none is: GOAWAY NO_ERROR naming the last stream taken (RFC 9113 §6.8),
then the close. Streams opened before that moment are served (the drain waits for them within
``shutdown_grace_s``). Not earlier, because the HTTP/2 clients the SDKs run on (httpx over
``h2``) fail every stream still in flight when any GOAWAY arrives, though RFC 9113 lets them
finish; a client that keeps its connection busy past twice the cap gets its GOAWAY then.

WebSocket over HTTP/2 (RFC 8441 extended CONNECT) is not offered: ``/v1/realtime`` is served on
HTTP/1.1 (a client that needs it connects with ALPN ``http/1.1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error, ProtocolError
from h2.settings import SettingCodes, Settings

from gateway.context import RECEIVED_AT
from gateway.server.http2_guards import Http2Guards
from gateway.server.http2_stream import Stream, open_stream
from gateway.server.state import Served, ServerState, WriteFlow, freeze_startup_objects

__all__ = ["CONNECTION_WINDOW", "Http2Protocol"]

#: the connection's receive window: streams' unread request bodies together (each stream's is
#: the default 65,535 octets), so one stalled upload does not stall the others
CONNECTION_WINDOW = 1 << 20
_CONFIG = H2Configuration(
    client_side=False,
    header_encoding=None,
    # the answer's head is made by the stream (lower-case names, no connection-specific ones)
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)


class _ServerConnection(H2Connection):
    """``h2``'s connection without its own cap on the streams a client opens, which would end
    the whole connection for a stream over SETTINGS_MAX_CONCURRENT_STREAMS — even in a client's
    first flight, sent before it could read the SETTINGS (RFC 9113 §6.5.2: until then the limit
    is unbounded). :class:`Http2Protocol` refuses such a stream instead (REFUSED_STREAM, RFC
    9113 §5.1.2), counting it against the reset bucket."""

    @property
    def open_inbound_streams(self) -> int:
        _ = super().open_inbound_streams  # h2 forgets its closed streams here: keep that
        return 0


def _address(transport: asyncio.Transport, key: str) -> tuple[str, int] | None:
    info = transport.get_extra_info(key)
    if isinstance(info, tuple | list) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class Http2Protocol(WriteFlow, Http2Guards):
    """One HTTP/2 client connection (see the module)."""

    def __init__(
        self, state: ServerState, loop: asyncio.AbstractEventLoop, scheme: str = "https"
    ) -> None:
        assert state.http2 is not None
        self.server_state = state
        self.app = state.app
        self.loop = loop
        self.scheme = scheme
        self.limits = state.http2
        self.client_limits = state.limits
        self.h2: H2Connection = _ServerConnection(config=_CONFIG)
        self.streams: dict[int, Stream] = {}
        self.goaway_last: int | None = None
        #: why the connection ends once no stream is in flight (None: it goes on)
        self.ending: bytes | None = None
        #: streams answered before their request body ended: until when it is read and dropped
        self._discard: dict[int, float] = {}
        self.requests = 0
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self._flush: asyncio.Handle | None = None

    # ------------------------------------------------------------ the transport's side

    def connection_made(self, transport: asyncio.BaseTransport, preread: bytes = b"") -> None:
        """Set up (SETTINGS, the connection's window); ``preread``: bytes already read (the
        preface that told a cleartext connection apart)."""
        self.transport = transport = cast(asyncio.Transport, transport)
        state = self.server_state
        connections: set[Served] = state.connections
        connections.add(self)
        if state.freeze_gc:
            freeze_startup_objects()
        self.client = _address(transport, "peername")
        self.server = _address(transport, "sockname")
        self._guards()
        limits = self.limits
        h2 = self.h2
        h2.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
            },
        )
        # HPACK's decoder stops at this (32 octets a field): before the client acknowledges
        # the SETTINGS too
        h2.decoder.max_header_list_size = limits.max_header_list_bytes
        h2.initiate_connection()
        h2.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
        if len(connections) > self.client_limits.max_connections:
            self.goaway(ErrorCodes.REFUSED_STREAM, b"max_client_connections")
            self.close()
            return
        self.flush()
        if preread:
            self.data_received(preread)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self._stop_guards()
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for stream in list(self.streams.values()):
            stream.lost()
        self.resume_writing()

    def eof_received(self) -> None:
        pass  # the transport closes; connection_lost follows

    def data_received(self, data: bytes) -> None:
        received = time.perf_counter()  # the Timeline's ``received`` of the streams it opens
        why = self.scan(data)
        if why is not None:
            self.fatal(why)
            return
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as exc:  # h2 has queued its GOAWAY
            why = f"{type(exc).__name__}: {exc}"
            self.fatal(why, getattr(exc, "error_code", ErrorCodes.PROTOCOL_ERROR))
            return
        streams = self.streams
        for event in events:
            if isinstance(event, DataReceived):
                stream = streams.get(event.stream_id)
                flow = event.flow_controlled_length
                if stream is not None and not stream.response_complete:
                    stream.received(event.data, flow, self.loop.time())
                else:
                    self._discarded(event.stream_id, flow)
            elif isinstance(event, RequestReceived):
                self._request(event.stream_id, event.headers, received)
                if self.transport.is_closing():  # a guard ended the connection
                    return
            elif isinstance(event, StreamEnded):
                if (stream := streams.get(event.stream_id)) is not None:
                    stream.ended()
                self._discard.pop(event.stream_id, None)
            else:
                self._event(event)
        self.flush()

    def _event(self, event: object) -> None:
        """The events a request does not make: windows, settings, resets, the client's end."""
        streams = self.streams
        if isinstance(event, WindowUpdated):
            if event.stream_id == 0:
                for each in streams.values():
                    each.window_opened()
            elif (one := streams.get(event.stream_id)) is not None:
                one.window_opened()
        elif isinstance(event, StreamReset):
            if (reset := streams.get(event.stream_id)) is not None:
                reset.lost()
        elif isinstance(event, RemoteSettingsChanged):
            if SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                for each in streams.values():
                    each.window_opened()
        elif isinstance(event, ConnectionTerminated):
            # h2's state machine is closed: nothing more can be sent on any stream
            self.close()

    def shutdown(self) -> None:
        """The server stops (SIGTERM): GOAWAY and the close, now when no stream is in flight,
        else at the first moment none is (see the module)."""
        self._end_when_idle(b"shutdown")

    # ------------------------------------------------------------ writing

    def flush(self) -> None:
        """Write what ``h2`` holds, now."""
        handle, self._flush = self._flush, None
        if handle is not None:
            handle.cancel()
        data = self.h2.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def flush_soon(self) -> None:
        """Write what ``h2`` holds at the end of this event-loop step (every stream's frames of
        the step in one write)."""
        if self._flush is None:
            self._flush = self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush = None
        self.flush()

    def sent_data(self) -> None:
        self.credit_window_updates()

    def date(self) -> bytes:
        return self.server_state.date

    # ------------------------------------------------------------ streams

    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]], stamp: float) -> None:
        h2 = self.h2
        if self.goaway_last is not None and stream_id > self.goaway_last:
            h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)  # after GOAWAY: not taken
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            why = self.reset_taken()
            if why is not None:
                self.fatal(why)
            return
        self._idle.end()
        head: dict[str, Any] = {"server": self.server, "client": self.client}
        head["scheme"] = self.scheme
        head[RECEIVED_AT] = stamp
        stream = open_stream(self, self.limits, stream_id, headers, head)
        self.streams[stream_id] = stream
        self.requests += 1
        cap = self.limits.max_requests_per_connection
        if self.requests >= cap:
            self._end_when_idle(b"max_requests_per_connection")
            if self.requests >= 2 * cap:  # a client never idle: its GOAWAY now
                self.goaway(ErrorCodes.NO_ERROR, b"max_requests_per_connection")
        task = self.loop.create_task(stream.run())
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def answered(self, stream: Stream) -> None:
        """An answer is complete. A request body still coming is read and dropped for up to
        ``linger_s`` (then RST_STREAM NO_ERROR, RFC 9113 §8.1), as HTTP/1.1's lingering close
        does: an httpx client sends the whole body before it reads an answer, and waits for a
        window a reset stream never opens."""
        self.server_state.total_requests += 1
        if stream.more_body:
            self._discard[stream.id] = self.loop.time() + self.client_limits.linger_s
            if stream.unacked:
                self._discarded(stream.id, stream.unacked)
            stream.unacked = 0
            stream.body.clear()
            self.flush_soon()

    def _discarded(self, stream_id: int, flow: int) -> None:
        """DATA of a stream refused, done or answered: dropped, its window opened again (a
        stream past its ``linger_s`` of that is reset instead)."""
        deadline = self._discard.get(stream_id)
        if deadline is not None and self.loop.time() > deadline:
            del self._discard[stream_id]
            with contextlib.suppress(H2Error):
                self.h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        if flow:
            self.h2.acknowledge_received_data(flow, stream_id)

    def finished(self, stream: Stream) -> None:
        """A stream's task is done: its slot is free. The last one of a connection that is
        to end (or that sent GOAWAY) ends it, else the idle wait begins."""
        if self.streams.pop(stream.id, None) is None or self.streams:
            return
        if self.ending is not None or self.goaway_last is not None:
            self.end(ErrorCodes.NO_ERROR, self.ending or b"")
        elif not self.transport.is_closing():
            self._idle.start()

    def _end_when_idle(self, why: bytes) -> None:
        """GOAWAY and the close at the first moment no stream is in flight (now, if none is)."""
        if self.ending is None:
            self.ending = why
        if not self.streams:
            self.end(ErrorCodes.NO_ERROR, why)
