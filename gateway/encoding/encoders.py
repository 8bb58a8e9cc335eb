"""Encoders: one interface (``encode``, ``flush`` after each SSE event, ``finish``) for br,
zstd, gzip and identity, at the levels of :mod:`gateway.encoding.levels`."""

from __future__ import annotations

import zlib
from typing import Final, Protocol

import brotli  # type: ignore[import-untyped]  # brotli 1.2 ships no type information
import zstandard

from gateway.encoding.codings import UnsupportedEncoding
from gateway.encoding.levels import (
    _POOL_MAX,
    BR_LGWIN,
    BR_QUALITY,
    BR_STREAM_LGWIN,
    BR_STREAM_QUALITY,
    GZIP_LEVEL,
    GZIP_STREAM_LEVEL,
    ZSTD_LEVEL,
    ZSTD_STREAM_LEVEL,
    ZSTD_STREAM_PARAMS,
)
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


class BrotliEncoder:
    """``br`` (RFC 7932); ``flush`` ends the meta-block so the client can decode what it has."""

    __slots__ = ("_c",)
    headers: RawHeaders = [(b"content-encoding", b"br")]

    def __init__(self, quality: int = BR_QUALITY, lgwin: int = BR_LGWIN) -> None:
        self._c = brotli.Compressor(quality=quality, lgwin=lgwin)

    def encode(self, chunk: bytes) -> bytes:
        out: bytes = self._c.process(chunk)
        return out

    def flush(self) -> bytes:
        out: bytes = self._c.flush()
        return out

    def finish(self) -> bytes:
        out: bytes = self._c.finish()
        return out


class GzipEncoder:
    """``gzip`` (RFC 1952) via zlib; ``flush`` is a Z_SYNC_FLUSH (an empty stored block)."""

    __slots__ = ("_z",)
    headers: RawHeaders = [(b"content-encoding", b"gzip")]

    def __init__(self, level: int = GZIP_LEVEL) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def encode(self, chunk: bytes) -> bytes:
        return self._z.compress(chunk)

    def flush(self) -> bytes:
        return self._z.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


class ZstdCompressorPool:
    """Finished ``ZstdCompressor`` objects, kept for the next response.

    Building one costs ~8 µs plus its context's tables; it serves one stream at a time, so each
    encoder takes one for its lifetime and gives it back on ``finish()`` (an abandoned encoder
    simply never gives its compressor back).
    """

    __slots__ = ("_free", "_level", "_params")

    def __init__(self, level: int, **params: int) -> None:
        self._level = level
        self._params = (
            zstandard.ZstdCompressionParameters.from_level(level, **params) if params else None
        )
        self._free: list[zstandard.ZstdCompressor] = []

    def acquire(self) -> zstandard.ZstdCompressor:
        if self._free:
            return self._free.pop()
        if self._params is None:
            return zstandard.ZstdCompressor(level=self._level)
        return zstandard.ZstdCompressor(compression_params=self._params)

    def release(self, compressor: zstandard.ZstdCompressor) -> None:
        if len(self._free) < _POOL_MAX:
            self._free.append(compressor)


class ZstdEncoder:
    """``zstd`` (RFC 8878, RFC 9659); ``flush`` ends the current block (ZSTD_e_flush)."""

    __slots__ = ("_cctx", "_obj", "_pool")
    headers: RawHeaders = [(b"content-encoding", b"zstd")]

    def __init__(self, pool: ZstdCompressorPool | None = None) -> None:
        self._pool = pool = pool or _ZSTD_BODY
        self._cctx = pool.acquire()
        self._obj = self._cctx.compressobj()

    def encode(self, chunk: bytes) -> bytes:
        return self._obj.compress(chunk)

    def flush(self) -> bytes:
        return self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def finish(self) -> bytes:
        out = self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        self._pool.release(self._cctx)  # the finished compressobj refuses any further use
        return out


_IDENTITY: Final = IdentityEncoder()  # stateless: one for everybody
_ZSTD_BODY: Final = ZstdCompressorPool(ZSTD_LEVEL)
_ZSTD_STREAM: Final = ZstdCompressorPool(ZSTD_STREAM_LEVEL, **ZSTD_STREAM_PARAMS)


def make_encoder(coding: str, *, stream: bool = False) -> Encoder:
    """A fresh encoder for one response (``coding`` as returned by :func:`negotiate`).

    ``stream=True`` for SSE: a profile tuned for flush-per-event and small per-stream memory.
    """
    if coding == "br":
        if stream:
            return BrotliEncoder(BR_STREAM_QUALITY, BR_STREAM_LGWIN)
        return BrotliEncoder(BR_QUALITY, BR_LGWIN)
    if coding == "zstd":
        return ZstdEncoder(_ZSTD_STREAM if stream else _ZSTD_BODY)
    if coding == "gzip":
        return GzipEncoder(GZIP_STREAM_LEVEL if stream else GZIP_LEVEL)
    if coding == "identity":
        return _IDENTITY
    raise UnsupportedEncoding(f"cannot encode {coding!r}")
