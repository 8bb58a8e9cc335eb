"""In-process transport for ``mock://`` backends: the embedded default needs no server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from urllib.parse import urlsplit

from gateway.config import BackendConfig
from gateway.mock.engine import MockSettings, bad_request, reply
from gateway.mock.stateful import MockObjects
from gateway.transports.base import Body
from gateway.types import RawHeaders


class MockResponse:
    __slots__ = ("_body", "_events", "headers", "status")
    #: no socket times from this client library (the hop times the attempt)
    started_at = sent_at = first_byte_at = done_at = None

    def __init__(
        self,
        status: int,
        headers: RawHeaders,
        body: bytes | None,
        events: AsyncIterator[bytes] | None,
    ) -> None:
        self.status = status
        self.headers = headers
        self._body = body
        self._events = events

    def complete_body(self, limit: int) -> bytes | None:
        body = self._body
        if body is None or len(body) > limit:
            return None
        self._body = b""  # taken: aiter_raw yields nothing more
        return body

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._body is not None:
            yield self._body
        elif self._events is not None:
            async for chunk in self._events:
                yield chunk

    async def aclose(self) -> None:
        if isinstance(self._events, AsyncGenerator):  # the mock's streams are async generators
            await self._events.aclose()


class MockTransport:
    def __init__(self, backend: BackendConfig) -> None:
        self._settings = MockSettings.from_url(backend.url)
        #: this backend's files, batches, conversations, ... (docs/spec.md §24)
        self.objects = MockObjects()

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body
    ) -> MockResponse:
        if isinstance(body, AsyncIterable):
            body = b"".join([chunk async for chunk in body])
        lowered = {k.lower(): v for k, v in headers}
        path = urlsplit(url).path
        try:
            settings = self._settings.from_headers(lowered)
        except ValueError as exc:
            r = bad_request(path, str(exc))
        else:
            stored = self.objects.reply(method, path, lowered, body or b"")
            r = stored if stored is not None else reply(method, path, body or b"", settings)
        if r.delay_s:
            await asyncio.sleep(r.delay_s)
        out: RawHeaders = [(b"content-type", r.content_type.encode())]
        if r.body is not None:
            out.append((b"content-length", str(len(r.body)).encode()))
        return MockResponse(r.status, out, r.body, r.events)

    async def aclose(self) -> None:
        return None
