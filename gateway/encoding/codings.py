"""Content-coding names as the headers write them, and the errors every codec raises."""

from __future__ import annotations

from typing import Final

_ALIASES: Final = {"x-gzip": "gzip"}  # RFC 9110 §8.4.1.3


class UnsupportedEncoding(ValueError):
    """A content coding the gateway cannot decode (or encode); it answers 415."""


class DecodeError(ValueError):
    """Corrupt or truncated coded data."""


class DecodedTooLarge(ValueError):
    """The decoded output would exceed ``max_output``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"decoded data exceeds {limit} bytes")
        self.limit = limit


def _codings(content_encoding: bytes | str) -> list[str]:
    """The header's codings, normalised, identity and empty list elements dropped."""
    text = (
        content_encoding.decode("latin-1")
        if isinstance(content_encoding, bytes)
        else content_encoding
    )
    names = (n.strip(" \t").lower() for n in text.split(","))
    return [_ALIASES.get(n, n) for n in names if n and n != "identity"]
