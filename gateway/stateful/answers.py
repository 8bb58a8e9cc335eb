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

from gateway.context import RequestContext
from gateway.hops.held import Held, hold, relay_rest, send_held

#: fields of an answer that name another object the same backend now holds
LINKED_FIELDS = ("output_file_id", "error_file_id")

#: (object id) -> record it as the answering backend's and this tenant's
Record = Callable[[str], Awaitable[None]]
#: (object id) -> whether the caller's tenant owns it
Owns = Callable[[str], Awaitable[bool]]


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
