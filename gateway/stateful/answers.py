"""What a stateful call's answer teaches the gateway, read before the client sees it
(docs/spec.md §24).

A create's answer carries the new object's id; a batch's, the ids of the output and error
files the backend made for it; a completed upload's, its file. Each is recorded as owned by
the answering backend and the caller's tenant *before the answer's first byte goes out*, so a
call naming it the moment it arrives — through any replica — finds it. A list is filtered to
the caller's tenant's objects; an Anthropic batch's ``results_url`` is made to point at the
gateway (the SDK fetches it as given).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.context import Attempt, RequestContext
from gateway.headers import DROP_RESPONSE, copy_headers, header_value, upstream_request_id
from gateway.streaming.bodies import HOLD_LIMIT, upstream_answered, upstream_finished
from gateway.transports.base import UpstreamResponse
from gateway.types import RawHeaders
from gateway.writer import ResponseWriter

_KEEP_LENGTH = DROP_RESPONSE - {b"content-length"}
#: fields of an answer that name another object the same backend now holds
LINKED_FIELDS = ("output_file_id", "error_file_id")

#: (object id) -> record it as the answering backend's and this tenant's
Record = Callable[[str], Awaitable[None]]
#: (object id) -> whether the caller's tenant owns it
Owns = Callable[[str], Awaitable[bool]]


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


async def record_linked(obj: dict[str, Any], record: Record, created: bool) -> None:
    """Record the object an answer created (``created``: a create call's ``id``) and the
    objects it links to (a batch's files, a completed upload's file)."""
    if created and isinstance(obj.get("id"), str):
        await record(obj["id"])
    for name in LINKED_FIELDS:
        if isinstance(linked := obj.get(name), str):
            await record(linked)
    file = obj.get("file")
    if isinstance(file, dict) and isinstance(file.get("id"), str):
        await record(file["id"])


async def tenant_only(page: dict[str, Any], owns: Owns) -> None:
    """Drop the objects of a list page that another tenant (or nobody known) owns."""
    data = page.get("data")
    if not isinstance(data, list):
        return
    kept = [o for o in data if isinstance(o, dict) and await owns(str(o.get("id")))]
    if len(kept) != len(data):
        page["data"] = kept
        if "first_id" in page:
            page["first_id"] = kept[0].get("id") if kept else None
        if "last_id" in page:
            page["last_id"] = kept[-1].get("id") if kept else None


def merge_pages(pages: list[dict[str, Any]]) -> dict[str, Any]:
    """One list page from each backend of a route, as one page (newest first).

    >>> merge_pages([{"object": "list", "data": [{"id": "a", "created_at": 1}], "has_more": False},
    ...              {"object": "list", "data": [{"id": "b", "created_at": 2}], "has_more": True}])
    {'object': 'list', 'data': [{'id': 'b', 'created_at': 2}, {'id': 'a', 'created_at': 1}], \
'has_more': True, 'first_id': 'b', 'last_id': 'a'}
    """
    data: list[Any] = []
    for page in pages:
        items = page.get("data")
        if isinstance(items, list):
            data.extend(items)

    def newest(o: Any) -> float:
        when = o.get("created_at", 0) if isinstance(o, dict) else 0
        return float(when) if isinstance(when, int | float) else 0.0

    if len(pages) > 1:
        data.sort(key=newest, reverse=True)
    merged: dict[str, Any] = dict(pages[0]) if pages else {"object": "list"}
    merged["data"] = data
    merged["has_more"] = any(p.get("has_more") is True for p in pages)
    if len(pages) > 1 or "first_id" in merged:
        merged["first_id"] = data[0].get("id") if data else None
        merged["last_id"] = data[-1].get("id") if data else None
    return merged


def gateway_results_url(ctx: RequestContext, obj: dict[str, Any]) -> bool:
    """An Anthropic batch's ``results_url`` pointed at this gateway (the SDK follows it as
    given; the backend's own URL would bypass the gateway, and the key it needs). True when
    it was changed."""
    if not isinstance(obj.get("results_url"), str) or not isinstance(obj.get("id"), str):
        return False
    host = next((v for k, v in ctx.scope["headers"] if k == b"host"), b"").decode("latin-1")
    scheme = ctx.scope.get("scheme", "http")
    obj["results_url"] = f"{scheme}://{host}/v1/messages/batches/{obj['id']}/results"
    return True


__all__ = [
    "LINKED_FIELDS",
    "Held",
    "gateway_results_url",
    "hold",
    "merge_pages",
    "record_linked",
    "relay_rest",
    "send_held",
    "tenant_only",
]


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
