"""The per-request response writer: the one place that sends to the client (docs/architecture.md,
habit 3).

It wraps ASGI ``send``. :meth:`ResponseWriter.start` is held by the callers until the headers
are final; it adds what every answer carries (``x-request-id``, ``Vary``, ``x-gateway-cache``
from the context, then ``Server-Timing`` / ``traceresponse`` from the header hook, computed at
that moment from the Timeline) and stamps ``client_first_byte``. The last body message stamps
``done``. After :attr:`started` an upstream failure can no longer become a 502: streams end
with an error event instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from gateway.context import BODY_FOLLOWS, RequestContext
from gateway.errors import GatewayError
from gateway.types import RawHeaders, Send

#: called right before the response headers go out; returns headers known at that time
HeaderHook = Callable[[RequestContext], RawHeaders]

_JSON = (b"content-type", b"application/json")


class ResponseWriter:
    __slots__ = ("_ctx", "_hook", "_send", "finished", "started")

    def __init__(self, ctx: RequestContext, send: Send, hook: HeaderHook | None) -> None:
        self._ctx = ctx
        self._send = send
        self._hook = hook
        self.started = False
        self.finished = False

    async def start(self, status: int, headers: RawHeaders, follows: bool = False) -> None:
        """The response head; ``follows``: the body is sent right after it, in the same step
        (the server writes both at once without a flush of the head's own)."""
        ctx = self._ctx
        ctx.timeline.client_first_byte = time.perf_counter()
        headers.extend(ctx.response_headers)
        if self._hook is not None:
            headers.extend(self._hook(ctx))
        ctx.answer.status = status
        self.started = True
        message = {"type": "http.response.start", "status": status, "headers": headers}
        if follows:
            message[BODY_FOLLOWS] = True
        await self._send(message)

    async def body(self, data: bytes, more: bool = False) -> None:
        """One body message; the last one (``more=False``) stamps ``done``."""
        if more:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
            return
        await self._send({"type": "http.response.body", "body": data})
        self.finished = True
        self._ctx.timeline.done = time.perf_counter()

    async def whole(self, status: int, headers: RawHeaders, body: bytes) -> None:
        """A complete answer in one go (``content-length`` added here)."""
        headers.append((b"content-length", str(len(body)).encode()))
        await self.start(status, headers, follows=True)
        await self.body(body)

    async def json(self, status: int, obj: object) -> None:
        await self.whole(status, [_JSON], orjson.dumps(obj))

    async def error(self, exc: GatewayError) -> None:
        """A gateway error in the OpenAI shape (docs/spec.md §5), with ``x-should-retry``."""
        self._ctx.answer.error = exc
        headers: RawHeaders = [
            _JSON,
            (b"x-should-retry", b"true" if exc.should_retry else b"false"),
            *exc.headers,
        ]
        await self.whole(exc.status, headers, exc.body())
