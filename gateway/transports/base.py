"""The upstream transport interface (docs/spec.md §1, docs/architecture.md, habit 4).

One implementation per client library, side by side, chosen per backend by :func:`for_backend`
(``transports/__init__.py``): aiohttp for HTTP/1.1 (the hot path), httpx2 for ``http2 = true``,
and the in-process mock for ``mock://``. Each implementation translates its library's exceptions
into the gateway's (:mod:`gateway.errors`) inside the transport, so nothing above this layer
ever sees an aiohttp or httpx2 exception.

Socket times (docs/spec.md §6): every response has ``started_at`` (connecting began, or on a pooled
connection = ``sent_at``), ``sent_at`` (the request's last byte handed to the socket),
``first_byte_at`` (the answer's first byte read) and ``done_at`` (its last byte read), as
``time.perf_counter()`` values, or None where the client library does not tell (aiohttp, httpx2,
the mock). The gateway's own HTTP/1.1 client (``http1_client``) keeps them; the relays
(:func:`gateway.streaming.bodies.upstream_answered`) then book exactly that window as the
upstream's time. Without them an attempt is timed around the call by the upstream hop.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Protocol

from gateway.headers import header_value
from gateway.types import RawHeaders

__all__ = ["Body", "Transport", "UpstreamResponse", "header_value"]

Body = bytes | AsyncIterable[bytes] | None


class UpstreamResponse(Protocol):
    status: int
    #: response headers, names lower-cased, as received (hop-by-hop ones included)
    headers: RawHeaders

    # the socket times (module docstring); None where the transport does not know them
    @property
    def started_at(self) -> float | None: ...
    @property
    def sent_at(self) -> float | None: ...
    @property
    def first_byte_at(self) -> float | None: ...
    @property
    def done_at(self) -> float | None: ...

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as the upstream sent it (still content-encoded), chunk by chunk as it arrives.

        Raises :class:`gateway.errors.UpstreamError` on resets and framing errors and
        :class:`gateway.errors.UpstreamTimeout` when a read exceeds the backend's read timeout.
        """
        ...

    def complete_body(self, limit: int) -> bytes | None:
        """The whole body, taken at once, when it is all read already and no bigger than
        ``limit`` (a small answer usually arrives with its head); None otherwise, and nothing
        taken — then :meth:`aiter_raw` reads it. It spares the relay an async iterator per
        answer on the hot path."""
        ...

    async def aclose(self) -> None:
        """Release the connection: back to the pool when the body was read, closed otherwise."""
        ...


class Transport(Protocol):
    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body
    ) -> UpstreamResponse:
        """Send a request and return once the response headers are in (body not read yet)."""
        ...

    async def aclose(self) -> None: ...
