"""Content-Encoding: negotiation and incremental codecs (SPEC §9, DESIGN habit 5).

Every encoder has the same three calls: ``encode(chunk)`` (may buffer), ``flush()`` (everything
given so far becomes decodable: called after each SSE event), ``finish()`` (end of the body).
"""

from __future__ import annotations

from typing import Protocol

from gateway.types import RawHeaders


class Encoder(Protocol):
    #: headers the encoded body needs (``content-encoding``), empty for identity
    headers: RawHeaders

    def encode(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...

    def finish(self) -> bytes: ...


class IdentityEncoder:
    headers: RawHeaders = []

    def encode(self, chunk: bytes) -> bytes:
        return chunk

    def flush(self) -> bytes:
        return b""

    def finish(self) -> bytes:
        return b""
