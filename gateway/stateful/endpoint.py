"""The stateful endpoints (docs/spec.md §24): files, uploads, batches, conversations, vector
stores, Anthropic message batches and files — each call sent to the backend holding the object
it names, and each object created recorded as its backend's and its tenant's.

A call naming an object (in its path, or in its body at a place of the reference table,
:mod:`gateway.hops.references`) goes to that object's owner, pinned
(:mod:`gateway.hops.ownership`: tried even when ejected, its error passes through); another
tenant's object, or with auth on one nobody is known to own, is a 404 (docs/spec.md §26), and
with auth on a path the gateway does not model is never forwarded. A call naming none goes to
a route chosen by
:mod:`gateway.stateful.choose`, or for an Anthropic batch by the model of its first request.
Uploads (``POST /v1/files``, upload parts) are streamed to the backend, file contents and
batch results streamed back: neither is ever held whole (docs/architecture.md, habit 3).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import orjson

from gateway.context import RequestContext
from gateway.errors import Forbidden, InvalidRequest, NotFound, UpstreamError
from gateway.hops.edge import read_body, stream_body
from gateway.hops.references import find, rule_for, segments
from gateway.hops.router import json_object
from gateway.routes import Backend, Route
from gateway.runtime import Runtime
from gateway.stateful.answers import (
    Held,
    gateway_results_url,
    hold,
    merge_pages,
    record_linked,
    relay_rest,
    send_held,
    tenant_only,
)
from gateway.stateful.batch_checks import charge, check_batch, results_tally
from gateway.stateful.choose import choose_route, take_route_header
from gateway.stateful.multipart import peek_purpose
from gateway.stateful.paths import Target, parse
from gateway.streaming.bodies import relay_raw, upstream_finished
from gateway.transports.base import Body, UpstreamResponse
from gateway.types import Receive, Scope, Send
from gateway.writer import ResponseWriter

#: what a batch needs, metered per batch (docs/spec.md §24): open to keys with a budget
_METERED = frozenset({"files", "uploads", "batches", "messages/batches"})
#: a list's cursor names the object the next page follows
_CURSORS = ("after", "after_id", "before_id")
#: the downloads priced as they pass (docs/spec.md §24): a file's content, a batch's results
_PRICED = frozenset({("files", "content"), ("messages/batches", "results")})


def anthropic_client(ctx: RequestContext) -> bool:
    """Whether the caller speaks Anthropic's API: ``anthropic-version`` (every Anthropic SDK
    request carries it) or a Files API beta."""
    for name, value in ctx.upstream_headers:
        if name == "anthropic-version" or (name == "anthropic-beta" and "files-api" in value):
            return True
    return False


async def stateful(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """``/v1/files``, ``/v1/uploads``, ``/v1/batches``, ``/v1/conversations``,
    ``/v1/vector_stores``, ``/v1/messages/batches`` and everything under them."""
    async with rt.request(scope, send) as req:
        ctx = req.ctx
        target = parse(ctx.path, anthropic_client(ctx))
        if target is None or target.malformed:  # another spelling: never forwarded (§26)
            raise NotFound(f"no such endpoint: {ctx.path}", code="unknown_path")
        await rt.auth.check(ctx, passthrough=target.collection not in _METERED)
        if ctx.tenant is not None and not target.modelled:  # a path not modelled: §26
            raise NotFound(f"no such endpoint: {ctx.path}", code="unknown_path")
        ctx.path = target.path  # one spelling, decided on and sent on
        await StatefulCall(rt, ctx, target, receive, req.out).run()


async def _counted(ctx: RequestContext, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An upload's chunks as they pass, their sum kept as the request's ``upload_bytes``."""
    ctx.upload_bytes = 0
    async for chunk in chunks:
        ctx.upload_bytes += len(chunk)
        yield chunk


def model_route(rt: Runtime, ctx: RequestContext, payload: dict[str, Any]) -> Route:
    """An Anthropic batch goes where its requests' model is served."""
    requests = payload.get("requests")
    models = (
        [
            r["params"].get("model")
            for r in requests
            if isinstance(r, dict) and isinstance(r.get("params"), dict)
        ]
        if isinstance(requests, list)
        else []
    )
    if not models or not all(isinstance(m, str) and m for m in models):
        raise InvalidRequest("requests: every request needs params.model", code="model_required")
    permits = ctx.permits
    for model in models:
        if permits is not None and not permits(model):
            raise Forbidden(f"this API key may not call model {model!r}", code="model_not_allowed")
    ctx.model = models[0]
    route = rt.router.match(models[0])
    if route is None:
        raise NotFound(f"no route for model {models[0]!r}", code="model_not_found")
    return route


class StatefulCall:
    """One stateful call (per request; module docstring)."""

    def __init__(
        self,
        rt: Runtime,
        ctx: RequestContext,
        target: Target,
        receive: Receive,
        out: ResponseWriter,
    ) -> None:
        self.rt = rt
        self.ctx = ctx
        self.target = target
        self.receive = receive
        self.out = out
        self.named_route = take_route_header(ctx)

    async def run(self) -> None:
        t, ctx = self.target, self.ctx
        if ctx.tenant is not None:  # ids after the object's, and in the query (§26)
            for object_id in segments(t.rest, ctx.query):
                await self.rt.ownership.not_foreign(object_id, ctx.tenant)
        if t.root and ctx.method == "GET":
            await self._list()
            return
        body, backends, pinned = await self._plan()
        self._answer_coding()
        resp, attempt = await self.rt.upstream.forward(ctx, backends, body, pinned=pinned)
        route = self._route_of(attempt.backend)
        ctx.object_call = (route.name if route else "none", t.operation(ctx.method))
        if t.streamed and 200 <= resp.status < 300:  # contents, results: counted as they pass
            await self._download(resp, attempt, route)
            return
        if not 200 <= resp.status < 300:
            await relay_raw(ctx, resp, attempt, self.out)
            return
        held = await self._hold(resp, attempt)
        if held is None:
            return
        backend = attempt.backend
        if held.obj is not None:
            made = ctx.method == "POST" and (t.root or t.rest == "parts")  # an upload's parts too
            await record_linked(held.obj, self._recorder(backend), made)
            if t.anthropic and gateway_results_url(ctx, held.obj):
                held.changed()
        if ctx.method == "DELETE" and t.object_id is not None and not t.rest:
            await self.rt.ownership.forget(t.object_id)
        await send_held(self.out, held, resp)

    def _priced(self) -> bool:
        """A download that may be a batch's results, to price: a file's content, an Anthropic
        batch's results, when ``[[prices]]`` are set (docs/spec.md §24, §26)."""
        if not self.rt.auth.prices:  # nothing has a price: nothing to read
            return False
        # whichever API the client speaks (an Anthropic client's headers read an OpenAI
        # batch's output file as well): any file's content is priced as it passes
        return (self.target.collection, self.target.rest) in _PRICED

    async def _download(self, resp: UpstreamResponse, attempt: Any, route: Route | None) -> None:
        """Contents and results, passed on as they arrive; a batch's results priced as they
        pass and, read to their end, debited (:mod:`gateway.stateful.batch_checks`)."""
        anthropic = self.target.collection == "messages/batches"  # its lines' shape
        tally = results_tally(self.rt, self.ctx, anthropic) if self._priced() else None
        watch = tally.lines.feed if tally is not None else None
        await relay_rest(self.ctx, resp, attempt, self.out, [], watch)
        if tally is not None and self.target.object_id is not None and not self.ctx.disconnected:
            ttl = route.config.object_ttl_s if route is not None else 30 * 86400.0
            await charge(self.rt, self.ctx, self.target.object_id, tally, ttl)

    def _route_of(self, backend: Backend) -> Route | None:
        return next((r for r in self.rt.router.routes if backend in r.backends), None)

    # ------------------------------------------------------------ where it goes

    async def _plan(self) -> tuple[Body, tuple[Backend, ...], bool]:
        """(the body to send, the backends to try, pinned)."""
        t, ctx = self.target, self.ctx
        if t.object_id is not None:
            owner = await self.rt.ownership.required(t.object_id, ctx.tenant)
            body = await self._body()
            if owner is not None:
                return body, (owner,), True
            return body, self._route(t.purpose).backends, False
        if t.collection == "files":  # multipart: the purpose is in the body's head
            purpose, streamed = await peek_purpose(self._stream())
            return streamed, self._route(purpose or t.purpose).backends, False
        raw, payload, owner = await self._checked()
        if t.collection == "messages/batches":
            backends = model_route(self.rt, ctx, payload).backends
            await check_batch(self.rt, ctx, payload, True, backends)
            return raw, backends, False
        if owner is not None:
            if t.collection == "batches":
                await check_batch(self.rt, ctx, payload, False, (owner,))
            return raw, (owner,), True
        purpose = payload.get("purpose")
        route = self._route(purpose if isinstance(purpose, str) else t.purpose)
        if t.collection == "batches":
            await check_batch(self.rt, ctx, payload, False, route.backends)
        return raw, route.backends, False

    def _route(self, purpose: str | None) -> Route:
        return choose_route(self.rt.router.routes, self.named_route, purpose, self.target.anthropic)

    async def _checked(self) -> tuple[bytes, dict[str, Any], Backend | None]:
        """The JSON body, checked: every stored object it names (the table of
        :mod:`gateway.hops.references`) is the tenant's (404), all on one backend — returned
        (None: it names none, or only unknown ones with auth off). An ambiguous body goes on
        re-serialised, as it was checked (docs/spec.md §26)."""
        raw = await read_body(self.ctx, self.receive, self.rt.max_body)
        if not raw:
            return raw, {}, None
        payload = json_object(raw)
        rule = rule_for(self.target.path)
        named = find(rule, raw, payload) if rule is not None else None
        if named is None:
            return raw, payload, None
        if named.ambiguous:
            raw = orjson.dumps(payload)
        owners = await self.rt.ownership.owners(named, self.ctx.tenant)
        if len(owners) > 1:
            raise InvalidRequest(
                "the objects named are held by different backends; one call can use only one",
                code="objects_on_different_backends",
            )
        return raw, payload, owners.pop() if owners else None

    # ------------------------------------------------------------ the request body

    def _stream(self) -> AsyncIterator[bytes] | None:
        """The body streamed on, never held (uploads), in the coding the client sent."""
        ctx = self.ctx
        if ctx.content_encoding is not None:
            ctx.upstream_headers.append(
                ("content-encoding", ctx.content_encoding.decode("latin-1"))
            )
        chunks = stream_body(ctx, self.receive, self.rt.config.server.max_upload_bytes)
        return None if chunks is None else _counted(ctx, chunks)

    async def _body(self) -> Body:
        t, ctx = self.target, self.ctx
        if ctx.method != "POST":
            return stream_body(ctx, self.receive, self.rt.max_body)
        if t.collection == "uploads" and t.rest == "parts":
            return self._stream()
        raw, _, _ = await self._checked()  # objects it names must be the tenant's
        return raw

    # ------------------------------------------------------------ the answer

    def _answer_coding(self) -> None:
        """Contents and results pass in the client's coding; answers the gateway reads —
        and a batch's results, priced as they pass — come uncompressed."""
        ctx = self.ctx
        if not self.target.streamed or self._priced():
            ctx.upstream_headers.append(("accept-encoding", "identity"))
        elif ctx.accept_encoding is not None:
            ctx.upstream_headers.append(("accept-encoding", ctx.accept_encoding.decode("latin-1")))

    async def _hold(self, resp: UpstreamResponse, attempt: Any) -> Held | None:
        held, parts = await hold(self.ctx, resp, attempt)
        if held is None:  # too long to read: passed on as it is
            await relay_rest(self.ctx, resp, attempt, self.out, parts)
        return held

    async def _page(self, resp: UpstreamResponse, attempt: Any) -> dict[str, Any] | None:
        """A list page, read whole to be filtered. With auth on, a page the gateway cannot read
        (longer than it holds, not JSON) is refused, never relayed with every tenant's ids
        (docs/spec.md §26); with auth off it passes as it is (None: it was sent)."""
        held, parts = await hold(self.ctx, resp, attempt)
        if held is not None and held.obj is not None:
            return held.obj
        if self.ctx.tenant is not None:
            if held is None:  # the rest is never read
                upstream_finished(self.ctx, attempt, resp)
                await resp.aclose()
            raise UpstreamError(
                f"the backend's list page is {'over 8 MiB' if held is None else 'not JSON'}: "
                "the gateway cannot filter it to your objects, and never relays it unfiltered; "
                "ask for a smaller page (?limit=)",
                code="list_unfiltered",
            )
        if held is None:
            await relay_rest(self.ctx, resp, attempt, self.out, parts)
        else:
            await send_held(self.out, held, resp)
        return None

    def _recorder(self, backend: Backend) -> Any:
        route = self._route_of(backend)
        ttl = route.config.object_ttl_s if route is not None else 30 * 86400.0
        ownership, tenant = self.rt.ownership, self.ctx.tenant

        async def record(object_id: str) -> None:
            await ownership.record(object_id, backend, ttl, tenant)

        return record

    async def _list(self) -> None:
        """A list: the cursor's owner, else every backend of the route, merged; only the
        caller's tenant's objects are kept (docs/spec.md §24)."""
        ctx, ownership = self.ctx, self.rt.ownership
        query = parse_qs(ctx.query.decode("latin-1"))
        cursor = next((query[c][0] for c in _CURSORS if c in query), None)
        owner = await ownership.required(cursor, ctx.tenant) if cursor else None
        if owner is not None:
            backends: tuple[Backend, ...] = (owner,)
        else:
            purpose = query.get("purpose", [self.target.purpose])[0]
            backends = self._route(purpose).backends
        route = self._route_of(backends[0])
        ctx.object_call = (route.name if route else "none", self.target.operation(ctx.method))
        self._answer_coding()
        pages = []
        for backend in backends:
            resp, attempt = await self.rt.upstream.forward(ctx, (backend,), None, pinned=True)
            if resp.status != 200:
                await relay_raw(ctx, resp, attempt, self.out)
                return
            held = await self._page(resp, attempt)
            if held is None:
                return
            pages.append(held)
        merged = merge_pages(pages)
        if ctx.tenant is not None:
            tenant = ctx.tenant

            async def owns(object_id: str) -> bool:
                found = await ownership.lookup(object_id)
                return found is not None and found[1] == tenant

            await tenant_only(merged, owns)
        await self.out.json(200, merged)


__all__ = ["StatefulCall", "stateful"]
