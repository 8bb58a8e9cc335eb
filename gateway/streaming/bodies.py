"""Non-stream answers: JSON held until complete, big bodies streamed on, raw passthrough.

- :func:`relay_json`: held until complete (bounded), so a short or broken body becomes a 502,
  never a truncated 200; only bodies beyond :data:`HOLD_LIMIT` stream on.
- :func:`relay_raw`: other ``/v1/*`` paths, passed through chunk by chunk.
- :func:`replay_json`: a cached answer.

Every relay closes the upstream response in a ``finally`` (docs/architecture.md, habit 4). Codings
follow
docs/spec.md §9: an upstream coding the client accepts passes through untouched; otherwise the body
is
decoded (bounded: a bomb is a 502, not an OOM) and encoded in the client's coding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.cache.replay import Entry
from gateway.context import Attempt, RequestContext
from gateway.encoding import (
    MIN_COMPRESS_BYTES,
    DecodedTooLarge,
    DecodeError,
    Decoder,
    UnsupportedEncoding,
    accepts,
    make_decoder,
    make_encoder,
)
from gateway.errors import UpstreamError
from gateway.headers import DROP_RESPONSE, copy_headers, header_value, upstream_request_id
from gateway.protocols import Api
from gateway.transports.base import UpstreamResponse
from gateway.types import RawHeaders
from gateway.writer import ResponseWriter

#: non-stream bodies up to this size are held until complete (honest 502 on a short body)
HOLD_LIMIT = 8 * 1024 * 1024
#: bounds on what an upstream's compressed answer may expand to (a bomb is a 502, not an OOM)
MAX_DECODED_BODY = 64 * 1024 * 1024
MAX_DECODED_STREAM = 1024 * 1024 * 1024
# the upstream's own Vary (e.g. Origin) is kept; the gateway adds Vary: Accept-Encoding
DROP_JSON = DROP_RESPONSE | {b"content-encoding"}
_KEEP_LENGTH = DROP_RESPONSE - {b"content-length"}
_JSON = (b"content-type", b"application/json")


async def relay_json(
    ctx: RequestContext,
    api: Api | None,
    resp: UpstreamResponse,
    attempt: Attempt,
    out: ResponseWriter,
) -> bytes | None:
    """Relay a non-stream answer; returns the decoded body when it was held whole."""
    upstream_answered(ctx, attempt, resp)
    try:
        # the usual small answer came whole with its head: taken at once, no async iterator
        raw = resp.complete_body(HOLD_LIMIT)
        if raw is None:
            parts: list[bytes] = []
            size = 0
            chunks = resp.aiter_raw()
            async for chunk in chunks:
                parts.append(chunk)
                size += len(chunk)
                if size > HOLD_LIMIT:
                    await _stream_rest(ctx, resp, out, parts, chunks)
                    return None
            raw = parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        upstream_finished(ctx, attempt, resp)
        await resp.aclose()
    upstream_coding = header_value(resp.headers, b"content-encoding")
    body = raw
    if upstream_coding is not None and upstream_coding.lower() != b"identity":
        body = _decode_whole(upstream_coding, raw)
    headers = copy_headers(resp.headers, DROP_JSON)
    headers.extend(upstream_request_id(resp.headers))
    if api is not None and 200 <= resp.status < 300:
        api.note_json_body(ctx.answer, body)
    if upstream_coding is not None and accepts(ctx.accept_encoding, upstream_coding):
        sent = raw  # already in a coding the client takes: never encode twice (docs/spec.md §9)
        headers.append((b"content-encoding", upstream_coding))
    else:
        sent = encode_body(body, ctx.coding, headers, ctx.accept_encoding)
    await out.whole(resp.status, headers, sent)
    return body


async def _stream_rest(
    ctx: RequestContext,
    resp: UpstreamResponse,
    out: ResponseWriter,
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
        headers = copy_headers(resp.headers, _KEEP_LENGTH)
        headers.extend(upstream_request_id(resp.headers))
        await out.start(resp.status, headers)
        await out.body(b"".join(parts), more=True)
        async for chunk in chunks:
            await out.body(chunk, more=True)
        await out.body(b"")
        return
    # Otherwise decode and re-encode as it flows, in the client's coding (chunked: a cut is
    # a missing last chunk on the client's side).
    decoder = stream_decoder(upstream_coding)
    encoder = make_encoder(ctx.coding)
    headers = copy_headers(resp.headers, DROP_JSON)
    headers.extend(upstream_request_id(resp.headers))
    headers.extend(encoder.headers)
    await out.start(resp.status, headers)

    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            yield part
        async for chunk in chunks:
            yield chunk

    async for chunk in body():
        data = chunk if decoder is None else decode_step(decoder, chunk)
        coded_chunk = encoder.encode(data)
        if coded_chunk:
            await out.body(coded_chunk, more=True)
    rest = decode_end(decoder) if decoder is not None else b""
    await out.body(encoder.encode(rest) + encoder.finish())


async def replay_json(
    ctx: RequestContext, body: bytes, out: ResponseWriter, entry: Entry | None = None
) -> None:
    """A cached JSON answer; compressed at most once per coding for its ``entry``."""
    headers: RawHeaders = [_JSON]
    coding = ctx.coding
    if entry is None or coding == "identity" or len(body) < MIN_COMPRESS_BYTES:
        await out.whole(200, headers, encode_body(body, coding, headers, ctx.accept_encoding))
        return
    memo = entry.encoded
    if memo is None:
        memo = entry.encoded = {}
    done = memo.get(coding)
    if done is None:
        extra: RawHeaders = []
        done = memo[coding] = (encode_body(body, coding, extra, ctx.accept_encoding), extra)
    headers.extend(done[1])
    await out.whole(200, headers, done[0])


async def relay_raw(
    ctx: RequestContext, resp: UpstreamResponse, attempt: Attempt, out: ResponseWriter
) -> None:
    """Pass an answer through chunk by chunk (paths the gateway does not interpret)."""
    upstream_answered(ctx, attempt, resp)
    try:
        headers = copy_headers(resp.headers, _KEEP_LENGTH)
        headers.extend(upstream_request_id(resp.headers))
        await out.start(resp.status, headers)
        async for chunk in resp.aiter_raw():
            await out.body(chunk, more=True)
        await out.body(b"")
    finally:
        upstream_finished(ctx, attempt, resp)
        await resp.aclose()


def upstream_answered(ctx: RequestContext, attempt: Attempt, resp: UpstreamResponse) -> None:
    """The answering attempt's socket times, where its transport keeps them (docs/spec.md §6).

    The upstream hop stamps an attempt around the transport call; a transport that knows when
    the request's last byte went out and the answer's first byte came in (the response's socket
    times, see :mod:`gateway.transports.base`) moves
    the attempt to those, so the client library's own work is the gateway's overhead.
    """
    attempt.at_sockets(resp.started_at, resp.first_byte_at)
    if ctx.attempts and ctx.attempts[0] is attempt:
        sent = resp.sent_at
        ctx.timeline.upstream_sent = attempt.start if sent is None else max(sent, attempt.start)


def upstream_finished(
    ctx: RequestContext, attempt: Attempt, resp: UpstreamResponse | None = None
) -> None:
    """The attempt is over: at the answer's last byte read when the transport knows it."""
    if attempt.end is None:
        done = resp.done_at if resp is not None else None
        attempt.finished(done if done is not None and done >= attempt.start else None)


# ---------------------------------------------------------------- codings


def encode_body(
    body: bytes, coding: str, headers: RawHeaders, accept: bytes | None = None
) -> bytes:
    """A whole body in the client's coding; bodies under 1 KiB stay identity (docs/spec.md §9)
    unless
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


def stream_decoder(coding: bytes | None) -> Decoder | None:
    """An incremental decoder for an upstream answer's coding (None for identity)."""
    if coding is None or coding.strip().lower() in (b"", b"identity"):
        return None
    try:
        return make_decoder(coding, MAX_DECODED_STREAM)
    except UnsupportedEncoding as exc:
        raise UpstreamError(
            f"upstream answer uses an unknown coding: {exc}", code="upstream_bad_encoding"
        ) from exc


def decode_step(decoder: Decoder, chunk: bytes) -> bytes:
    try:
        return decoder.decode(chunk)
    except (DecodeError, DecodedTooLarge) as exc:
        raise UpstreamError(
            f"upstream stream is not validly encoded: {exc}", code="upstream_bad_encoding"
        ) from exc


def decode_end(decoder: Decoder) -> bytes:
    try:
        return decoder.flush()
    except DecodeError as exc:
        raise UpstreamError(
            f"upstream stream encoding was cut: {exc}", code="upstream_bad_encoding"
        ) from exc
