"""SSE parsing, stream validation and the three response relays (SPEC §8).

- :func:`relay_json`: non-stream answers. Held until complete (bounded), so a short or broken
  body becomes a 502, never a truncated 200; only bodies beyond :data:`HOLD_LIMIT` stream on.
- :func:`relay_sse`: ``stream: true`` answers, relayed event by event as they arrive.
  Headers go out with the first event (until then a failure is still a clean 502). A stream
  that breaks, ends without ``data: [DONE]`` or idles past ``stream_idle_timeout_s`` ends with
  the SPEC §8 error event so SDKs raise. A client that goes away cancels the upstream read.
- :func:`relay_raw`: other ``/v1/*`` paths, passed through chunk by chunk.

Every relay closes the upstream response in a ``finally`` (DESIGN habit 4).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import orjson

from gateway.context import Attempt, RequestContext, Timeline
from gateway.encoding import (
    MIN_COMPRESS_BYTES,
    DecodedTooLarge,
    DecodeError,
    Decoder,
    Encoder,
    UnsupportedEncoding,
    accepts,
    make_decoder,
    make_encoder,
)
from gateway.errors import GatewayError, UpstreamError, UpstreamStreamError, UpstreamTimeout
from gateway.hops.edge import HOP_BY_HOP
from gateway.transports.base import UpstreamResponse, header_value
from gateway.types import RawHeaders, Receive, Send

#: non-stream bodies up to this size are held until complete (honest 502 on a short body)
HOLD_LIMIT = 8 * 1024 * 1024
#: bounds on what an upstream's compressed answer may expand to (a bomb is a 502, not an OOM)
MAX_DECODED_BODY = 64 * 1024 * 1024
MAX_DECODED_STREAM = 1024 * 1024 * 1024
#: response headers never copied from the upstream (the gateway sets its own)
_DROP_RESPONSE = HOP_BY_HOP | {b"content-length", b"server", b"date", b"x-request-id"}
_SSE_HEADERS: RawHeaders = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]

_T = TypeVar("_T")

#: called right before the response headers go out; returns headers known at that time
HeaderHook = Callable[[RequestContext], RawHeaders]


def copy_headers(
    upstream: RawHeaders, drop: frozenset[bytes] | set[bytes] = _DROP_RESPONSE
) -> RawHeaders:
    out: RawHeaders = []
    connection_named: set[bytes] = set()
    for k, v in upstream:
        if k == b"connection":
            connection_named.update(t.strip().lower() for t in v.split(b","))
        elif k not in drop:
            if k == b"vary" and v.strip().lower() == b"accept-encoding":
                continue  # the gateway sends its own
            out.append((k, v))
    if connection_named:
        out = [(k, v) for k, v in out if k not in connection_named]
    return out


def upstream_request_id(upstream: RawHeaders) -> list[tuple[bytes, bytes]]:
    for k, v in upstream:
        if k == b"x-request-id":
            return [(b"x-upstream-request-id", v)]
    return []


# ---------------------------------------------------------------- SSE parsing


class SSEParser:
    """Incremental splitter of an SSE byte stream into raw events (WHATWG HTML §9.2.6).

    Events end at a blank line; lines end with CRLF, LF or CR. :meth:`feed` returns each
    complete event's bytes exactly as received (terminator included), so the relay forwards
    what the upstream sent and an incomplete tail never reaches the client. A CR that ends a
    chunk could be the first half of a CRLF, so that event waits for the next byte; only
    CR-only streams (not seen in practice) would feel it.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        events: list[bytes] = []
        start = 0
        if b"\r" not in buf:  # the common case: LF-only framing
            while (i := buf.find(b"\n\n", start)) >= 0:
                events.append(buf[start : i + 2])
                start = i + 2
            self._buf = buf[start:]
            return events
        pos = start
        line_start = start
        n = len(buf)
        while pos < n:
            c = buf[pos]
            if c == 0x0A or c == 0x0D:  # \n or \r
                if c == 0x0D:
                    if pos + 1 >= n:
                        break  # a CR at the end may be half of a CRLF: wait for more
                    end = pos + 2 if buf[pos + 1] == 0x0A else pos + 1
                else:
                    end = pos + 1
                if pos == line_start:  # empty line: the event is complete
                    if line_start > start:
                        events.append(buf[start:end])
                    start = end
                line_start = end
                pos = end
            else:
                pos += 1
        self._buf = buf[start:]
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished event (non-empty at end of stream means the stream was cut)."""
        return self._buf


def event_data(raw: bytes) -> bytes | None:
    """The ``data`` of one raw event (data lines joined by LF); None for comment-only events."""
    data: list[bytes] = []
    for line in raw.splitlines():
        if line.startswith(b"data"):
            value = line[4:]
            if value[:1] == b":":
                value = value[1:]
                if value[:1] == b" ":
                    value = value[1:]
            elif value:  # a field named e.g. "database": not data
                continue
            data.append(value)
    return b"\n".join(data) if data else None


DONE = b"[DONE]"


# ---------------------------------------------------------------- response facts


def note_answer(ctx: RequestContext, obj: Any) -> bool:
    """Record id/model/usage/finish reasons from a chat/completion object or chunk.

    Returns True when the object carries content (a delta with content, tool calls, text).
    """
    if not isinstance(obj, dict):
        return False
    if ctx.response_id is None and isinstance(obj.get("id"), str):
        ctx.response_id = obj["id"]
    if ctx.response_model is None and isinstance(obj.get("model"), str):
        ctx.response_model = obj["model"]
    usage = obj.get("usage")
    if isinstance(usage, dict):
        note_usage(ctx, usage)
    content = False
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            fr = choice.get("finish_reason")
            if isinstance(fr, str):
                if ctx.finish_reasons is None:
                    ctx.finish_reasons = []
                ctx.finish_reasons.append(fr)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text = delta.get("content")
                if (
                    text
                    or delta.get("tool_calls")
                    or delta.get("refusal")
                    or delta.get("reasoning_content")
                ):
                    content = True
            else:
                text = choice.get("text")
                if text:
                    content = True
                message = choice.get("message")
                if isinstance(message, dict):
                    text = message.get("content")
            if ctx.captured is not None and isinstance(text, str) and text:
                ctx.captured.append(text)
    return content


def note_usage(ctx: RequestContext, usage: dict[str, Any]) -> None:
    pt = usage.get("prompt_tokens", usage.get("input_tokens"))
    ct = usage.get("completion_tokens", usage.get("output_tokens"))
    if isinstance(pt, int):
        ctx.input_tokens = pt
    if isinstance(ct, int):
        ctx.output_tokens = ct


def note_json_body(ctx: RequestContext, body: bytes) -> None:
    """Read usage (and for small bodies id/model/finish reasons) from a JSON answer."""
    if len(body) <= 64 * 1024:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        note_answer(ctx, obj)
        return
    # Large bodies are embeddings: parse only the usage object at the end, not 1536 floats.
    i = body.rfind(b'"usage"')
    j = body.find(b"{", i) if i >= 0 else -1
    k = body.find(b"}", j) if j >= 0 else -1
    if k > j >= 0:
        try:
            usage = orjson.loads(body[j : k + 1])
        except orjson.JSONDecodeError:
            return
        if isinstance(usage, dict):
            note_usage(ctx, usage)


# ---------------------------------------------------------------- relays


Tee = Callable[[bytes, "bytes | None", Any], None]


class Relay:
    """Writes answers to the client; one per app (no per-request state on self, habit 2).

    ``coding`` arguments are what :func:`gateway.encoding.negotiate` chose for the client.
    """

    def __init__(self, header_hook: HeaderHook | None = None) -> None:
        self._header_hook = header_hook

    async def start(
        self, ctx: RequestContext, send: Send, status: int, headers: RawHeaders
    ) -> None:
        ctx.timeline.client_first_byte = time.perf_counter()
        headers.extend(ctx.response_headers)
        if self._header_hook is not None:
            headers.extend(self._header_hook(ctx))
        ctx.status = status
        ctx.response_started = True
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def error(self, ctx: RequestContext, exc: GatewayError, send: Send) -> None:
        """Render a gateway error in the OpenAI shape (SPEC §5)."""
        ctx.error = exc
        body = exc.body()
        headers: RawHeaders = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-should-retry", b"true" if exc.should_retry else b"false"),
        ]
        await self.start(ctx, send, exc.status, headers)
        await send({"type": "http.response.body", "body": body})
        ctx.timeline.done = time.perf_counter()

    # ------------------------------------------------------------ JSON

    async def relay_json(
        self,
        ctx: RequestContext,
        resp: UpstreamResponse,
        attempt: Attempt,
        send: Send,
        coding: str = "identity",
    ) -> bytes | None:
        """Relay a non-stream answer; returns the decoded body when it was held whole."""
        parts: list[bytes] = []
        size = 0
        try:
            chunks = resp.aiter_raw()
            async for chunk in chunks:
                parts.append(chunk)
                size += len(chunk)
                if size > HOLD_LIMIT:
                    await self._stream_rest(ctx, resp, send, parts, chunks)
                    return None
        finally:
            _upstream_finished(ctx, attempt)
            await resp.aclose()
        raw = parts[0] if len(parts) == 1 else b"".join(parts)
        upstream_coding = header_value(resp.headers, b"content-encoding")
        body = raw
        if upstream_coding is not None and upstream_coding.lower() != b"identity":
            body = _decode_whole(upstream_coding, raw)
        headers = copy_headers(resp.headers, _DROP_JSON)
        headers.extend(upstream_request_id(resp.headers))
        if 200 <= resp.status < 300:
            note_json_body(ctx, body)
        if upstream_coding is not None and accepts(ctx.accept_encoding, upstream_coding):
            out = raw  # already in a coding the client takes: never encode twice (SPEC §9)
            headers.append((b"content-encoding", upstream_coding))
        else:
            out = encode_body(body, coding, headers, ctx.accept_encoding)
        headers.append((b"content-length", str(len(out)).encode()))
        await self.start(ctx, send, resp.status, headers)
        await send({"type": "http.response.body", "body": out})
        ctx.timeline.done = time.perf_counter()
        return body

    async def _stream_rest(
        self,
        ctx: RequestContext,
        resp: UpstreamResponse,
        send: Send,
        parts: list[bytes],
        chunks: AsyncIterator[bytes],
    ) -> None:
        """Too big to hold: stream the rest on (a later failure drops the connection)."""
        upstream_coding = header_value(resp.headers, b"content-encoding")
        coded = upstream_coding is not None and upstream_coding.strip().lower() != b"identity"
        if coded and upstream_coding is not None:
            passthrough = accepts(ctx.accept_encoding, upstream_coding)
        else:
            passthrough = ctx.coding == "identity"
        if passthrough:
            # As the upstream sent it, keeping its Content-Length (and coding): a later cut shows
            # the client a short body, never a complete one.
            headers = copy_headers(resp.headers, _DROP_RESPONSE - {b"content-length"})
            headers.extend(upstream_request_id(resp.headers))
            await self.start(ctx, send, resp.status, headers)
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            ctx.timeline.done = time.perf_counter()
            return
        # Otherwise decode and re-encode as it flows, in the client's coding (chunked: a cut is
        # a missing last chunk on the client's side).
        decoder = _stream_decoder(upstream_coding)
        encoder = make_encoder(ctx.coding)
        headers = copy_headers(resp.headers, _DROP_JSON)
        headers.extend(upstream_request_id(resp.headers))
        headers.extend(encoder.headers)
        await self.start(ctx, send, resp.status, headers)

        async def body() -> AsyncIterator[bytes]:
            for part in parts:
                yield part
            async for chunk in chunks:
                yield chunk

        async for chunk in body():
            data = chunk if decoder is None else _decode_step(decoder, chunk)
            out = encoder.encode(data)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
        rest = _decode_end(decoder) if decoder is not None else b""
        await send({"type": "http.response.body", "body": encoder.encode(rest) + encoder.finish()})
        ctx.timeline.done = time.perf_counter()

    async def replay_json(self, ctx: RequestContext, body: bytes, send: Send, coding: str) -> None:
        """A cached JSON answer."""
        headers: RawHeaders = [(b"content-type", b"application/json")]
        out = encode_body(body, coding, headers, ctx.accept_encoding)
        headers.append((b"content-length", str(len(out)).encode()))
        await self.start(ctx, send, 200, headers)
        await send({"type": "http.response.body", "body": out})
        ctx.timeline.done = time.perf_counter()

    # ------------------------------------------------------------ raw passthrough

    async def relay_raw(
        self, ctx: RequestContext, resp: UpstreamResponse, attempt: Attempt, send: Send
    ) -> None:
        """Pass an answer through chunk by chunk (paths the gateway does not interpret)."""
        try:
            headers = copy_headers(resp.headers, _DROP_RESPONSE - {b"content-length"})
            headers.extend(upstream_request_id(resp.headers))
            await self.start(ctx, send, resp.status, headers)
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            ctx.timeline.done = time.perf_counter()
        finally:
            _upstream_finished(ctx, attempt)
            await resp.aclose()

    # ------------------------------------------------------------ SSE

    def _sse_headers(self, extra: RawHeaders, encoder: Encoder) -> RawHeaders:
        headers = list(_SSE_HEADERS)
        headers.extend(extra)
        headers.extend(encoder.headers)
        return headers

    async def relay_sse(
        self,
        ctx: RequestContext,
        resp: UpstreamResponse,
        attempt: Attempt,
        send: Send,
        receive: Receive,
        idle_timeout: float,
        coding: str = "identity",
        tee: Tee | None = None,
    ) -> UpstreamStreamError | None:
        """Relay an SSE answer event by event; returns the cut, if the stream was cut."""
        return await _until_disconnect(
            ctx,
            receive,
            self._relay_events(
                ctx, resp, attempt, send, idle_timeout, make_encoder(coding, stream=True), tee
            ),
            cleanup=lambda: _finish_upstream(ctx, attempt, resp),
        )

    async def _relay_events(
        self,
        ctx: RequestContext,
        resp: UpstreamResponse,
        attempt: Attempt,
        send: Send,
        idle_timeout: float,
        encoder: Encoder,
        tee: Tee | None,
    ) -> UpstreamStreamError | None:
        ctype = header_value(resp.headers, b"content-type") or b""
        if not ctype.lower().startswith(b"text/event-stream"):
            raise UpstreamError(
                f"upstream answered a streaming request with content-type "
                f"{ctype.decode('latin-1') or 'none'!r}, not text/event-stream",
                code="upstream_bad_content_type",
            )
        decoder = _stream_decoder(header_value(resp.headers, b"content-encoding"))
        parser = SSEParser()
        timeline = ctx.timeline
        loop = asyncio.get_running_loop()
        extra = copy_headers(resp.headers, _DROP_SSE)
        extra.extend(upstream_request_id(resp.headers))
        headers = self._sse_headers(extra, encoder)
        done = False
        cut: UpstreamStreamError | None = None
        try:
            async with asyncio.timeout(idle_timeout) as idle:
                async for received in resp.aiter_raw():
                    chunk = received if decoder is None else _decode_step(decoder, received)
                    events = parser.feed(chunk)
                    if not events:
                        idle.reschedule(loop.time() + idle_timeout)
                        continue
                    now = time.perf_counter()
                    out: list[bytes] = []
                    for raw in events:
                        if done:
                            break  # nothing after [DONE] is part of the answer
                        data = event_data(raw)
                        obj: Any = None
                        if data == DONE:
                            done = True
                        elif data is not None and data[:1] == b"{":
                            try:
                                obj = orjson.loads(data)
                            except orjson.JSONDecodeError:
                                obj = None
                            if note_answer(ctx, obj) and timeline.first_content is None:
                                timeline.first_content = now
                        out.append(raw)
                        if tee is not None:
                            tee(raw, data, obj)
                    if out:
                        if timeline.last_event is not None:
                            if timeline.event_gaps is None:
                                timeline.event_gaps = []
                            timeline.event_gaps.append(now - timeline.last_event)
                        timeline.last_event = now
                        if not ctx.response_started:
                            await self.start(ctx, send, 200, headers)
                        body = encoder.encode(b"".join(out)) + encoder.flush()
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                    if done:
                        break
                    idle.reschedule(loop.time() + idle_timeout)
                if decoder is not None and not done:
                    parser.feed(_decode_end(decoder))
        except TimeoutError:
            cut = UpstreamStreamError(
                f"upstream stream was idle for more than {idle_timeout:g} s",
                code="upstream_stream_idle_timeout",
            )
        except (UpstreamError, UpstreamTimeout) as exc:
            if not ctx.response_started:
                raise
            cut = UpstreamStreamError(f"upstream stream broke: {exc.message}")
        else:
            if not done:
                what = "ended without data: [DONE]"
                if parser.pending.strip():
                    what = "ended in the middle of an event"
                cut = UpstreamStreamError(f"upstream stream {what}")
        _upstream_finished(ctx, attempt)
        if cut is not None:
            if not ctx.response_started:
                raise cut_to_http(cut)
            ctx.error = cut
            tail = encoder.encode(cut.sse_event()) + encoder.finish()
        else:
            tail = encoder.finish()
        await send({"type": "http.response.body", "body": tail})
        timeline.done = time.perf_counter()
        return cut

    async def replay_sse(
        self,
        ctx: RequestContext,
        events: AsyncIterator[bytes] | Iterator[bytes],
        send: Send,
        receive: Receive,
        coding: str,
    ) -> None:
        """A cached or followed answer as SSE: one write per event, no artificial delay."""

        async def run() -> None:
            encoder = make_encoder(coding, stream=True)
            await self.start(ctx, send, 200, self._sse_headers([], encoder))
            timeline = ctx.timeline
            if isinstance(events, AsyncIterator):
                async for raw in events:
                    await self._replayed_event(ctx, timeline, raw, encoder, send)
            else:
                for raw in events:
                    await self._replayed_event(ctx, timeline, raw, encoder, send)
            await send({"type": "http.response.body", "body": encoder.finish()})
            timeline.done = time.perf_counter()

        await _until_disconnect(ctx, receive, run())

    async def _replayed_event(
        self, ctx: RequestContext, timeline: Timeline, raw: bytes, encoder: Encoder, send: Send
    ) -> None:
        if timeline.first_content is None and raw.startswith(b"data: {"):
            timeline.first_content = time.perf_counter()
        body = encoder.encode(raw) + encoder.flush()
        await send({"type": "http.response.body", "body": body, "more_body": True})


VARY = (b"vary", b"Accept-Encoding")
# the upstream's own Vary (e.g. Origin) is kept; the gateway adds Vary: Accept-Encoding
_DROP_JSON = _DROP_RESPONSE | {b"content-encoding"}
_DROP_SSE = _DROP_RESPONSE | {b"content-type", b"cache-control", b"content-encoding"}


def encode_body(
    body: bytes, coding: str, headers: RawHeaders, accept: bytes | None = None
) -> bytes:
    """A whole body in the client's coding; bodies under 1 KiB stay identity (SPEC §9) unless
    the client refused identity outright (``identity;q=0``)."""
    if coding == "identity":
        return body
    if len(body) < MIN_COMPRESS_BYTES and accepts(accept, "identity"):
        return body
    encoder = make_encoder(coding)
    headers.extend(encoder.headers)
    return encoder.encode(body) + encoder.finish()


def _decode_whole(coding: bytes, raw: bytes) -> bytes:
    try:
        decoder = make_decoder(coding, MAX_DECODED_BODY)
        return decoder.decode(raw) + decoder.flush()
    except (UnsupportedEncoding, DecodeError, DecodedTooLarge) as exc:
        raise UpstreamError(
            f"upstream body is not valid {coding.decode('latin-1')}: {exc}",
            code="upstream_bad_encoding",
        ) from exc


def _stream_decoder(coding: bytes | None) -> Decoder | None:
    """An incremental decoder for an upstream answer's coding (None for identity)."""
    if coding is None or coding.strip().lower() in (b"", b"identity"):
        return None
    try:
        return make_decoder(coding, MAX_DECODED_STREAM)
    except UnsupportedEncoding as exc:
        raise UpstreamError(
            f"upstream answer uses an unknown coding: {exc}", code="upstream_bad_encoding"
        ) from exc


def _decode_step(decoder: Decoder, chunk: bytes) -> bytes:
    try:
        return decoder.decode(chunk)
    except (DecodeError, DecodedTooLarge) as exc:
        raise UpstreamError(
            f"upstream stream is not validly encoded: {exc}", code="upstream_bad_encoding"
        ) from exc


def _decode_end(decoder: Decoder) -> bytes:
    try:
        return decoder.flush()
    except DecodeError as exc:
        raise UpstreamError(
            f"upstream stream encoding was cut: {exc}", code="upstream_bad_encoding"
        ) from exc


async def _until_disconnect(
    ctx: RequestContext,
    receive: Receive,
    work: Coroutine[Any, Any, _T],
    cleanup: Callable[[], Awaitable[None]] | None = None,
) -> _T | None:
    """Run ``work`` until it ends or the client disconnects (then cancel it at once)."""
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.ensure_future(_watch_disconnect(receive, task, ctx))
    try:
        return await work
    except asyncio.CancelledError:
        if not ctx.disconnected:
            raise
        task.uncancel()
        return None
    finally:
        watcher.cancel()
        if cleanup is not None:
            await cleanup()


async def _finish_upstream(ctx: RequestContext, attempt: Attempt, resp: UpstreamResponse) -> None:
    _upstream_finished(ctx, attempt)
    await resp.aclose()


def cut_to_http(cut: UpstreamStreamError) -> GatewayError:
    """Before any byte reached the client a cut stream is an ordinary 502 (or 504 when idle)."""
    if cut.code == "upstream_stream_idle_timeout":
        return UpstreamTimeout(cut.message, code=cut.code)
    return UpstreamError(cut.message, code=cut.code)


def _upstream_finished(ctx: RequestContext, attempt: Attempt) -> None:
    if attempt.end is None:
        attempt.end = time.perf_counter()
        ctx.timeline.upstream_done = attempt.end


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ctx: RequestContext) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ctx.disconnected = True
            task.cancel()
            return
