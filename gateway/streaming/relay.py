"""The SSE relay (docs/spec.md §8): one upstream stream to one client, event by event.

A relay is a small state machine, one object per stream (docs/architecture.md, habit 2)::

    awaiting_first ──first event sent──▶ streaming ──end marker──▶ done
          │                                  │
          │ upstream fails / ends early      ├── upstream fails, ends early, idles ──▶ cut
          ▼                                  │
      (an ordinary 502/504: nothing sent)    └── client disconnects ──────────────────▶ gone

Headers go out with the first event, so until then a failure is still a clean 502 (or 504
when idle). After that a cut stream ends with the API's own error event (``data: {"error":
…}`` for chat, ``event: error`` for responses and messages) so SDKs raise instead of returning
a silently short answer; a client that goes away cancels the upstream read at once (the
connection is closed, not pooled).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import orjson

from gateway.budgets.spend import charge_relayed
from gateway.context import Attempt, RequestContext, Timeline
from gateway.deadline import Deadline
from gateway.encoding import Encoder, make_encoder
from gateway.errors import GatewayError, UpstreamError, UpstreamStreamError, UpstreamTimeout
from gateway.headers import DROP_RESPONSE, copy_headers, header_value, upstream_request_id
from gateway.protocols import Api
from gateway.streaming.bodies import (
    decode_end,
    decode_step,
    stream_decoder,
    upstream_answered,
    upstream_finished,
)
from gateway.streaming.sse import SSEParser, event_data
from gateway.transports.base import UpstreamResponse
from gateway.types import RawHeaders, Receive
from gateway.writer import ResponseWriter

_T = TypeVar("_T")

SSE_HEADERS: RawHeaders = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_DROP_SSE = DROP_RESPONSE | {b"content-type", b"cache-control", b"content-encoding"}

#: fed every relayed event: (raw event, its data, its parsed JSON) — the cache's tee
Tee = Callable[[bytes, "bytes | None", Any], None]


class State(enum.Enum):
    AWAITING_FIRST = "awaiting_first"
    STREAMING = "streaming"
    DONE = "done"
    CUT = "cut"
    GONE = "gone"


class SSERelay:
    __slots__ = (
        "_decoder",
        "_encoder",
        "_parser",
        "api",
        "attempt",
        "content",
        "ctx",
        "cut",
        "idle_timeout",
        "last",
        "out",
        "resp",
        "state",
        "strip_usage",
        "tee",
    )

    def __init__(
        self,
        ctx: RequestContext,
        api: Api,
        resp: UpstreamResponse,
        attempt: Attempt,
        out: ResponseWriter,
        idle_timeout: float,
        tee: Tee | None = None,
        strip_usage: bool = False,
    ) -> None:
        self.ctx = ctx
        self.api = api
        self.resp = resp
        self.attempt = attempt
        self.out = out
        self.idle_timeout = idle_timeout
        self.tee = tee
        self.state = State.AWAITING_FIRST
        self.cut: UpstreamStreamError | None = None
        #: the JSON of the last relayed event that had one (the error event may continue it)
        self.last: Any = None
        #: content-bearing events relayed (what a client that cuts the stream is charged for)
        self.content = 0
        #: the gateway asked the upstream for usage the client did not ask for: its usage chunk
        #: is read (and teed into the cache) but not relayed (docs/spec.md §20)
        self.strip_usage = strip_usage
        self._parser = SSEParser()
        self._decoder = stream_decoder(header_value(resp.headers, b"content-encoding"))
        self._encoder: Encoder = make_encoder(ctx.coding, stream=True)

    async def run(self, receive: Receive) -> UpstreamStreamError | None:
        """Relay until done, cut or the client is gone; returns the cut, if any."""
        upstream_answered(self.ctx, self.attempt, self.resp)
        try:
            self._check_head()
        except GatewayError:
            await self._close_upstream()
            raise
        # the idle timer and the disconnect watcher are set up once this task first waits: a
        # stream whose first events came with its head writes them before either exists
        watchdog = _IdleWatchdog(self.idle_timeout)
        await until_disconnect(
            self.ctx,
            receive,
            self._pump(watchdog),
            cleanup=self._close_upstream,
            waiting=watchdog.arm,
        )
        if self.ctx.disconnected:
            self._on_client_gone()
        return self.cut

    def _check_head(self) -> None:
        ctype = header_value(self.resp.headers, b"content-type") or b""
        if not ctype.lower().startswith(b"text/event-stream"):
            raise UpstreamError(
                f"upstream answered a streaming request with content-type "
                f"{ctype.decode('latin-1') or 'none'!r}, not text/event-stream",
                code="upstream_bad_content_type",
            )

    async def _pump(self, watchdog: _IdleWatchdog) -> None:
        decoder = self._decoder
        try:
            try:
                async for received in self.resp.aiter_raw():
                    chunk = received if decoder is None else decode_step(decoder, received)
                    events = self._parser.feed(chunk)
                    if events:
                        await self._on_events(events)
                        if self.state is State.DONE:
                            break
                    watchdog.touch()
                if self.state is not State.DONE:  # what the last read left: a decoder's
                    # tail, a CR-only stream's last event (its CR was a line end, not half a CRLF)
                    tail = self._parser.feed(decode_end(decoder)) if decoder is not None else []
                    tail += self._parser.finish()
                    if tail:
                        await self._on_events(tail)
            finally:
                watchdog.stop()
        except asyncio.CancelledError:
            if not watchdog.expired_now():
                raise
            self._on_idle()
        except (UpstreamError, UpstreamTimeout) as exc:
            self._on_upstream_error(exc)
        else:
            if self.state is not State.DONE:
                self._on_upstream_end()
        upstream_finished(self.ctx, self.attempt, self.resp)
        await self._finish()

    # ------------------------------------------------------------ transitions

    async def _on_events(self, events: list[bytes]) -> None:
        """Forward complete events (one write, one flush); the end marker ends the relay."""
        ctx = self.ctx
        api = self.api
        answer = ctx.answer
        timeline = ctx.timeline
        tee = self.tee
        now = time.perf_counter()
        out: list[bytes] = []
        last = self.last
        content = 0
        for raw in events:
            data = event_data(raw)
            obj: Any = None
            if data is not None and data[:1] == b"{":
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    obj = None
                else:
                    last = obj
                if api.note_answer(answer, obj):
                    content += 1
                    if timeline.first_content is None:
                        timeline.first_content = now
            if tee is not None:
                tee(raw, data, obj)
            if self.strip_usage and _usage_only(obj):
                continue  # read for spend and the cache; the client did not ask for it
            out.append(raw)
            if api.is_end(raw, data, obj):
                self.state = State.DONE  # nothing after the end marker is part of the answer
                break
        self.last = last
        self.content += content
        _event_gap(timeline, now)
        if not self.out.started:
            await self._start(bool(out))
        if out:
            encoder = self._encoder
            await self.out.body(encoder.encode(b"".join(out)) + encoder.flush(), more=True)

    async def _start(self, follows: bool) -> None:
        """The response's head, with the first events (``follows``: written in the same step,
        so the server sends head and events in one write, with no flush of the head's own)."""
        headers = list(SSE_HEADERS)
        headers.extend(copy_headers(self.resp.headers, _DROP_SSE))
        headers.extend(upstream_request_id(self.resp.headers))
        headers.extend(self._encoder.headers)
        await self.out.start(200, headers, follows)
        if self.state is State.AWAITING_FIRST:
            self.state = State.STREAMING

    def _on_upstream_end(self) -> None:
        what = f"ended without {self.api.end_marker}"
        if self._parser.pending.strip():
            what = "ended in the middle of an event"
        self._cut(UpstreamStreamError(f"upstream stream {what}"))

    def _on_idle(self) -> None:
        self._cut(
            UpstreamStreamError(
                f"upstream stream was idle for more than {self.idle_timeout:g} s",
                code="upstream_stream_idle_timeout",
            )
        )

    def _on_upstream_error(self, exc: UpstreamError | UpstreamTimeout) -> None:
        if self.state is State.AWAITING_FIRST:
            raise exc  # nothing reached the client: an ordinary 502/504
        self._cut(UpstreamStreamError(f"upstream stream broke: {exc.message}"))

    def _on_client_gone(self) -> None:
        self.state = State.GONE
        charge_relayed(self.ctx, self.content)  # cut before its usage arrived: never $0

    def _cut(self, cut: UpstreamStreamError) -> None:
        self.cut = cut
        if self.state is State.AWAITING_FIRST:
            raise cut_to_http(cut)
        self.state = State.CUT

    async def _finish(self) -> None:
        encoder = self._encoder
        if self.cut is not None:
            self.ctx.answer.error = self.cut
            tail = encoder.encode(self.api.error_event(self.cut, self.last))
            tail += encoder.finish()
        else:
            tail = encoder.finish()
        await self.out.body(tail)

    async def _close_upstream(self) -> None:
        upstream_finished(self.ctx, self.attempt, self.resp)
        await self.resp.aclose()


def _event_gap(timeline: Timeline, now: float) -> None:
    """The time since the previous relayed events (the live view's gaps)."""
    if timeline.last_event is not None:
        if timeline.event_gaps is None:
            timeline.event_gaps = []
        timeline.event_gaps.append(now - timeline.last_event)
    timeline.last_event = now


def _usage_only(obj: Any) -> bool:
    """The usage chunk of ``stream_options.include_usage``: ``choices: []`` with a usage."""
    return type(obj) is dict and obj.get("choices") == [] and obj.get("usage") is not None


class _IdleWatchdog(Deadline):
    """The stream idle timeout (:class:`gateway.deadline.Deadline`: one timer per stream, each
    chunk only notes the time): a real idle stretch cancels the relay's task, turned into the
    idle cut by :meth:`expired_now`. The stretch begins when it is made; its timer is armed
    (:meth:`arm`) when the relay first waits, so first events that came with the head are
    written before any timer exists (a stopped watchdog is never armed)."""

    __slots__ = ("_cancelling", "_task")

    def __init__(self, timeout: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        super().__init__(task.get_loop(), timeout, task.cancel)
        self._task = task
        self._cancelling = task.cancelling()
        self.begin()

    def expired_now(self) -> bool:
        """Whether the CancelledError being handled is this watchdog's (then it is consumed);
        any other cancellation (the client went away, shutdown) must propagate."""
        return self.expired and self._task.uncancel() <= self._cancelling


def cut_to_http(cut: UpstreamStreamError) -> GatewayError:
    """Before any byte reached the client a cut stream is an ordinary 502 (or 504 when idle)."""
    if cut.code == "upstream_stream_idle_timeout":
        return UpstreamTimeout(cut.message, code=cut.code)
    return UpstreamError(cut.message, code=cut.code)


async def replay_sse(
    ctx: RequestContext,
    events: AsyncIterator[bytes] | Iterable[bytes],
    out: ResponseWriter,
    receive: Receive,
) -> None:
    """A cached or followed answer as SSE: one write per event, no artificial delay."""

    async def run() -> None:
        encoder = make_encoder(ctx.coding, stream=True)
        headers = list(SSE_HEADERS)
        headers.extend(encoder.headers)
        await out.start(200, headers)
        timeline = ctx.timeline
        if isinstance(events, AsyncIterator):
            async for raw in events:
                await _replayed(timeline, raw, encoder, out)
        else:
            for raw in events:
                await _replayed(timeline, raw, encoder, out)
        await out.body(encoder.finish())

    await until_disconnect(ctx, receive, run())


async def _replayed(timeline: Timeline, raw: bytes, encoder: Encoder, out: ResponseWriter) -> None:
    if timeline.first_content is None and raw.startswith(b"data: {"):
        timeline.first_content = time.perf_counter()
    await out.body(encoder.encode(raw) + encoder.flush(), more=True)


async def until_disconnect(
    ctx: RequestContext,
    receive: Receive,
    work: Coroutine[Any, Any, _T],
    cleanup: Callable[[], Awaitable[None]] | None = None,
    waiting: Callable[[], object] | None = None,
) -> _T | None:
    """Run ``work`` until it ends or the client disconnects (then cancel it at once).

    The watcher is made when this task first waits (a callback the loop runs after the current
    step): what the step writes before that — a stream's first events, when they came with its
    head — goes out without a task made first (docs/spec.md §8). ``waiting`` is called then
    too. Work that ends without ever waiting makes no watcher at all."""
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch(receive, task, ctx, waiting)
    handle = task.get_loop().call_soon(watch.start)
    try:
        return await work
    except asyncio.CancelledError:
        if not ctx.disconnected:
            raise
        task.uncancel()
        return None
    finally:
        handle.cancel()
        watcher = watch.watcher
        if watcher is not None:
            watcher.cancel()
        if cleanup is not None:
            await cleanup()


class _Watch:
    """The deferred start of :func:`until_disconnect`'s watcher."""

    __slots__ = ("ctx", "receive", "task", "waiting", "watcher")

    def __init__(
        self,
        receive: Receive,
        task: asyncio.Task[Any],
        ctx: RequestContext,
        waiting: Callable[[], object] | None,
    ) -> None:
        self.receive = receive
        self.task = task
        self.ctx = ctx
        self.waiting = waiting
        self.watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.task.done():
            return
        self.watcher = self.task.get_loop().create_task(
            _watch_disconnect(self.receive, self.task, self.ctx)
        )
        if self.waiting is not None:
            self.waiting()


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ctx: RequestContext) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ctx.disconnected = True
            task.cancel()
            return
