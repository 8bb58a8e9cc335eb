"""Content-Encoding: negotiation and incremental codecs (docs/spec.md §9, docs/architecture.md,
habit 5).

Every encoder has the same three calls: ``encode(chunk)`` (may buffer), ``flush()`` (everything
given so far becomes decodable: called after each SSE event), ``finish()`` (end of the body).
Every decoder has two: ``decode(chunk)`` and ``flush()`` (end of input: raises when the coded
stream is truncated). Decoders bound what they materialise, so a decompression bomb costs at
most about ``max_output`` bytes of memory, never the size it claims.

>>> coding = negotiate(b"gzip;q=0.8, br")
>>> coding
'br'
>>> enc = make_encoder(coding)
>>> body = enc.encode(b"data: hi\\n\\n") + enc.flush() + enc.finish()
>>> make_decoder(b"br").decode(body)
b'data: hi\\n\\n'

The package: :mod:`~gateway.encoding.negotiation` (Accept-Encoding),
:mod:`~gateway.encoding.encoders`, :mod:`~gateway.encoding.decoders`,
:mod:`~gateway.encoding.request_bodies` (the edge's decoder, raising the gateway's errors),
:mod:`~gateway.encoding.levels` (the levels chosen, and why) and
:mod:`~gateway.encoding.codings` (coding names and the errors every codec raises).
"""

from __future__ import annotations

from gateway.encoding.codings import DecodedTooLarge, DecodeError, UnsupportedEncoding
from gateway.encoding.decoders import Decoder, make_decoder
from gateway.encoding.encoders import (
    BrotliEncoder,
    Encoder,
    GzipEncoder,
    IdentityEncoder,
    ZstdCompressorPool,
    ZstdEncoder,
    make_encoder,
)
from gateway.encoding.levels import MIN_COMPRESS_BYTES
from gateway.encoding.negotiation import accepts, negotiate
from gateway.encoding.request_bodies import request_body_decoder

__all__ = [
    "MIN_COMPRESS_BYTES",
    "BrotliEncoder",
    "DecodeError",
    "DecodedTooLarge",
    "Decoder",
    "Encoder",
    "GzipEncoder",
    "IdentityEncoder",
    "UnsupportedEncoding",
    "ZstdCompressorPool",
    "ZstdEncoder",
    "accepts",
    "make_decoder",
    "make_encoder",
    "negotiate",
    "request_body_decoder",
]
