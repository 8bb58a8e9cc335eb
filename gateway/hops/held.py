"""Answers read whole before the client sees them (docs/spec.md §24, §26): bounded by
:data:`~gateway.streaming.bodies.HOLD_LIMIT`; a longer one is passed on as it arrives, or —
where it must be read (a list to filter) — refused by the caller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.context import Attempt, RequestContext
from gateway.headers import DROP_RESPONSE, copy_headers, header_value, upstream_request_id
from gateway.streaming.bodies import HOLD_LIMIT, upstream_answered, upstream_finished
from gateway.transports.base import UpstreamResponse
from gateway.types import RawHeaders
from gateway.writer import ResponseWriter

_KEEP_LENGTH = DROP_RESPONSE - {b"content-length"}


class Held:
    """An answer read whole (bounded by :data:`HOLD_LIMIT`): its JSON when it is JSON."""

    __slots__ = ("body", "headers", "obj", "status")

    def __init__(self, status: int, headers: RawHeaders, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.obj: dict[str, Any] | None = None
        coding = header_value(headers, b"content-encoding")
        if 200 <= status < 300 and coding in (None, b"identity"):
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                self.obj = parsed

    def changed(self) -> None:
        """The JSON was edited: it is what the client gets."""
        self.body = orjson.dumps(self.obj)


async def hold(
    ctx: RequestContext, resp: UpstreamResponse, attempt: Attempt
) -> tuple[Held | None, list[bytes]]:
    """Read an answer up to :data:`HOLD_LIMIT`: (the held answer, []) or, for a longer one,
    (None, the chunks read so far) — the caller streams those and the rest on, unread."""
    upstream_answered(ctx, attempt, resp)
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.aiter_raw():
            parts.append(chunk)
            size += len(chunk)
            if size > HOLD_LIMIT:
                return None, parts
    except BaseException:
        upstream_finished(ctx, attempt, resp)
        await resp.aclose()
        raise
    upstream_finished(ctx, attempt, resp)
    await resp.aclose()
    return Held(resp.status, copy_headers(resp.headers), b"".join(parts)), []


async def send_held(out: ResponseWriter, held: Held, resp: UpstreamResponse) -> None:
    headers = held.headers
    headers.extend(upstream_request_id(resp.headers))
    await out.whole(held.status, headers, held.body)


async def relay_rest(
    ctx: RequestContext,
    resp: UpstreamResponse,
    attempt: Attempt,
    out: ResponseWriter,
    parts: list[bytes],
    watch: Callable[[bytes], None] | None = None,
) -> None:
    """An answer passed on as it arrives (contents, results, one too long to hold): the chunks
    read so far, then the rest; its size is the request's ``download_bytes``. ``watch`` sees
    each chunk as it passes (a batch's results are priced so: docs/spec.md §24)."""
    if not parts:
        upstream_answered(ctx, attempt, resp)
    size = sum(len(c) for c in parts)
    try:
        headers = copy_headers(resp.headers, _KEEP_LENGTH)
        headers.extend(upstream_request_id(resp.headers))
        await out.start(resp.status, headers)
        for chunk in parts:
            await out.body(chunk, more=True)
        async for chunk in resp.aiter_raw():
            size += len(chunk)
            if watch is not None:
                watch(chunk)
            await out.body(chunk, more=True)
        await out.body(b"")
        ctx.download_bytes = size
    finally:
        upstream_finished(ctx, attempt, resp)
        await resp.aclose()


def listing(obj: Any) -> bool:
    """Whether an answer lists stored objects (a page whose ``data`` holds objects with ids,
    OpenAI's and Anthropic's list shape alike).

    >>> listing({"object": "list", "data": [{"id": "file-1"}]}), listing({"data": [{"x": 1}]})
    (True, False)
    """
    data = obj.get("data") if isinstance(obj, dict) else None
    return isinstance(data, list) and any(isinstance(x, dict) and "id" in x for x in data)


__all__ = ["Held", "hold", "listing", "relay_rest", "send_held"]
