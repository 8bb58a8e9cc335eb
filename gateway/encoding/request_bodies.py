"""Request bodies (docs/spec.md §9): a client may send gzip, br or zstd; the edge decodes it
with the gateway's own errors (415, 413, 400)."""

from __future__ import annotations

from typing import Final

from gateway.encoding.codings import DecodedTooLarge, DecodeError, UnsupportedEncoding, _codings
from gateway.encoding.decoders import Decoder, _make_decoder
from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

#: what clients may send (docs/spec.md §9: gzip, br or zstd; anything else is 415)
_REQUEST_CODINGS: Final = frozenset({"gzip", "br", "zstd"})


class _RequestBodyDecoder:
    __slots__ = ("_coding", "_inner", "_limit")

    def __init__(self, inner: Decoder, limit: int, coding: str) -> None:
        self._inner = inner
        self._limit = limit
        self._coding = coding

    def decode(self, chunk: bytes) -> bytes:
        try:
            return self._inner.decode(chunk)
        except DecodedTooLarge as exc:
            raise self._too_large() from exc
        except DecodeError as exc:
            raise self._invalid(exc) from exc

    def flush(self) -> bytes:
        try:
            return self._inner.flush()
        except DecodedTooLarge as exc:
            raise self._too_large() from exc
        except DecodeError as exc:
            raise self._invalid(exc) from exc

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body exceeds the limit of {self._limit} bytes once decoded",
            code="body_too_large",
        )

    def _invalid(self, exc: DecodeError) -> InvalidRequest:
        return InvalidRequest(
            f"request body is not valid {self._coding} data: {exc}",
            code="invalid_content_encoding",
        )


def request_body_decoder(content_encoding: bytes, limit: int) -> Decoder:
    """A decoder for a request body that raises the gateway's own errors, for the edge.

    Raises ``UnsupportedMediaType`` (415) now for a coding other than gzip, br, zstd (or
    identity); its ``decode``/``flush`` raise ``PayloadTooLarge`` (413) once the decoded body
    passes ``limit`` bytes and ``InvalidRequest`` (400) for corrupt or truncated data.
    """
    codings = _codings(content_encoding)
    try:
        inner = _make_decoder(codings, limit, _REQUEST_CODINGS)
    except UnsupportedEncoding as exc:
        raise UnsupportedMediaType(
            f"Content-Encoding {content_encoding.decode('latin-1')!r} is not supported "
            "(use gzip, br or zstd)",
            code="unsupported_content_encoding",
        ) from exc
    return _RequestBodyDecoder(inner, limit, ", ".join(codings) or "identity")
