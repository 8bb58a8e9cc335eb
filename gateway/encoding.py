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
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import IO, Final, NoReturn, Protocol, cast

import brotli  # type: ignore[import-untyped]  # brotli 1.2 ships no type information
import zstandard

from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from gateway.memo import remember
from gateway.types import RawHeaders

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

#: non-stream bodies smaller than this stay identity (the caller applies it): below ~1 KiB the
#: coding's framing eats most of the gain and the CPU is wasted.
MIN_COMPRESS_BYTES: Final = 1024

# ---------------------------------------------------------------- levels
#
# Chosen with ``python loadtests/compression.py`` on the shapes the gateway serves: a ~30 KB
# embeddings body (floats), the same vector in base64 (what the openai SDK asks for), a ~1.6 KB
# chat.completion, and a 200-event SSE stream flushed after every event. The rule: the cheapest
# level (CPU per response, encoder construction included) within about one point of "bytes
# saved" of the best ordinary level (br 11 and zstd 19 cost 100x+ and are out of the running);
# for streams, resident memory per live encoder breaks ties, since a stream's encoder lives as
# long as the stream and there are as many as concurrent streams.
#
# Bodies (one encode + finish):
#  - br 3, 64 KiB window: within 0.2 points of the best br level on both embeddings bodies at the
#    lowest CPU of q3-q6 (~220 µs for 30 KB of floats, where q5 takes ~720 µs and is 2 points
#    *worse*). On a ~1.6 KB chat body q5 saves 4 points more (~60 bytes), but both fit one TCP
#    segment, so that is not worth 1.8x the CPU. lgwin 16 changes nothing at these sizes and
#    allocates ~3x less than the default 22 (which shows as CPU: page faults per response).
#  - zstd 3: within a point of zstd 6 everywhere at a third of its CPU; zstd 1 loses ~4 points
#    on chat. (The small-table stream profile would do as well here, but bodies can be large.)
#  - gzip 4: the bytes of gzip 6-9 (within half a point) at under half of gzip 6's CPU on float
#    embeddings (~540 vs ~1200 µs); gzip 1 loses ~1.5 points on chat.
BR_QUALITY: Final = 3
BR_LGWIN: Final = 16
ZSTD_LEVEL: Final = 3
GZIP_LEVEL: Final = 4
#
# Streams (encode + flush per event):
#  - br 3, 64 KiB window (the body profile): within a point of q4-q6 (93.2 % vs 93.3-93.9 %) at
#    about two thirds of their CPU and ~270 KiB per live stream (q4 ~520, q5 ~900, q6 ~1200);
#    q1 barely compresses flushed events (16 %: no context across meta-blocks).
#  - zstd 3 with small tables (64 KiB window, hash/chain log 12): the bytes of stock zstd 3 on
#    small events at ~80 KiB per stream instead of ~800.
#  - gzip 1: within a point of gzip 9 (94.1 % vs 95.0 %) at the lowest CPU of the gzip levels; all
#    levels hold the same ~90 KiB per stream. Deflate's sync flush is the lightest framing, so
#    gzip streams come out the smallest of the three codings anyway.
BR_STREAM_QUALITY: Final = 3
BR_STREAM_LGWIN: Final = 16
ZSTD_STREAM_LEVEL: Final = 3
ZSTD_STREAM_PARAMS: Final[Mapping[str, int]] = MappingProxyType(
    {"window_log": 16, "hash_log": 12, "chain_log": 12}
)
GZIP_STREAM_LEVEL: Final = 1

#: RFC 9659 §3: HTTP zstd encoders MUST NOT need, decoders MUST support, an 8 MB window; a bigger
#: one is refused rather than allocated.
ZSTD_MAX_WINDOW: Final = 8 * 1024 * 1024

# ---------------------------------------------------------------- errors


class UnsupportedEncoding(ValueError):
    """A content coding this module cannot decode (or encode); the gateway answers 415."""


class DecodeError(ValueError):
    """Corrupt or truncated coded data."""


class DecodedTooLarge(ValueError):
    """The decoded output would exceed ``max_output``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"decoded data exceeds {limit} bytes")
        self.limit = limit


# ---------------------------------------------------------------- negotiation (RFC 9110 §12.5.3)

#: the codings we produce, in server preference order (used to break q ties)
_PRODUCED: Final = ("br", "zstd", "gzip", "identity")
_ALIASES: Final = {"x-gzip": "gzip"}  # RFC 9110 §8.4.1.3
#: RFC 9110 §5.6.2 tchar: a coding is a token
_TCHAR: Final = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_OWS: Final = b" \t"
_CACHE_MAX: Final = 1024
#: longer header values are parsed every time rather than cached, so the cache stays small
_CACHEABLE_LEN: Final = 256


class _Preferences:
    """One Accept-Encoding value, parsed: q-values in thousandths (exact comparisons)."""

    __slots__ = ("best", "explicit", "star")

    def __init__(self, explicit: dict[str, int], star: int | None) -> None:
        self.explicit = explicit
        self.star = star
        best: str | None = None
        best_q = 0
        for coding in _PRODUCED:  # strict ">" keeps the preferred coding on ties
            q = self.q(coding)
            if q > best_q:
                best, best_q = coding, q
        self.best = best

    def q(self, coding: str) -> int:
        q = self.explicit.get(coding)
        if q is not None:
            return q
        if self.star is not None:  # "*" matches any coding not listed, identity included
            return self.star
        # Identity is acceptable unless excluded (identity;q=0 or *;q=0), but as the fallback:
        # the lowest weight, so any listed coding we produce beats it ("gzip;q=0.5" means gzip).
        return 1 if coding == "identity" else 0


def _qvalue(value: bytes) -> int | None:
    """RFC 9110 §12.4.2 ``qvalue`` in thousandths, or None when malformed."""
    if not 1 <= len(value) <= 5 or value[:1] not in (b"0", b"1"):
        return None
    if len(value) == 1:
        return 1000 if value == b"1" else 0
    if value[1:2] != b".":
        return None
    frac = value[2:]
    if frac and not frac.isdigit():  # bytes.isdigit: ASCII digits only
        return None
    if value[:1] == b"1":
        return 1000 if not frac.strip(b"0") else None
    return int(frac.ljust(3, b"0")) if frac else 0


def _parse(value: bytes) -> _Preferences:
    explicit: dict[str, int] = {}
    star: int | None = None
    for element in value.split(b","):
        token, _, params = element.partition(b";")
        token = token.strip(_OWS).lower()
        if not token or token.translate(None, _TCHAR):
            continue  # empty list element, or not a token: ignored
        q: int | None = 1000
        if params:
            for param in params.split(b";"):
                name, eq, raw = param.partition(b"=")
                if name.strip(_OWS).lower() == b"q":
                    q = _qvalue(raw.strip(_OWS)) if eq else None
                    if q is None:
                        break
                # other parameters are not in the grammar; tolerated and ignored
        if q is None:
            continue  # malformed weight: the element is ignored, not the header
        coding = token.decode("ascii")
        coding = _ALIASES.get(coding, coding)
        # a coding listed twice: the lower weight wins (an explicit refusal is honoured, and the
        # answer does not depend on the order of the elements)
        if coding == "*":
            star = q if star is None else min(star, q)
        else:
            explicit[coding] = min(q, explicit.get(coding, q))
    return _Preferences(explicit, star)


#: No header: RFC 9110 would allow any coding, but we never guess that a client can decode one.
_ABSENT: Final = _parse(b"")
_PREFERENCES: dict[bytes, _Preferences] = {}
_ACCEPTS: dict[tuple[bytes | None, str | bytes], bool] = {}


def _preferences(accept_encoding: bytes | None) -> _Preferences:
    if accept_encoding is None:
        return _ABSENT
    prefs = _PREFERENCES.get(accept_encoding)
    if prefs is None:
        prefs = _parse(accept_encoding)
        if len(accept_encoding) <= _CACHEABLE_LEN:
            remember(_PREFERENCES, accept_encoding, prefs, _CACHE_MAX)
    return prefs


def negotiate(accept_encoding: bytes | None) -> str | None:
    """The coding to answer with: ``"br"``, ``"zstd"``, ``"gzip"``, ``"identity"``, or None.

    None means nothing we can produce is acceptable (the gateway answers 406). An absent header
    gives ``"identity"``; so does an empty one (RFC 9110: "does not want any content coding").

    >>> negotiate(b"gzip, deflate, br, zstd"), negotiate(b"gzip;q=1, br;q=0.5")
    ('br', 'gzip')
    >>> negotiate(None), negotiate(b"deflate"), negotiate(b"identity;q=0, deflate")
    ('identity', 'identity', None)
    """
    return _preferences(accept_encoding).best


def accepts(accept_encoding: bytes | None, coding: str | bytes) -> bool:
    """Whether the client accepts ``coding`` (e.g. an upstream's Content-Encoding, to pass an
    already encoded body through untouched). A list (``"gzip, br"``) needs every coding in it.

    >>> accepts(b"gzip, deflate", "deflate"), accepts(b"gzip", "br"), accepts(None, "gzip")
    (True, False, False)
    """
    key = (accept_encoding, coding)
    hit = _ACCEPTS.get(key)
    if hit is None:
        prefs = _preferences(accept_encoding)
        text = coding.decode("latin-1") if isinstance(coding, bytes) else coding
        names = [n.strip(" \t").lower() for n in text.split(",")]
        names = [_ALIASES.get(n, n) for n in names if n]
        hit = all(prefs.q(n) > 0 for n in names or ["identity"])
        if len(accept_encoding or b"") + len(coding) <= _CACHEABLE_LEN:
            remember(_ACCEPTS, key, hit, _CACHE_MAX)
    return hit


# ---------------------------------------------------------------- encoders


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


_POOL_MAX: Final = 32


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


# ---------------------------------------------------------------- decoders


class Decoder(Protocol):
    def decode(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes:
        """End of input: the rest of the output; raises DecodeError when truncated."""
        ...


#: the most a decoder asks of its library per step (bounded output, joined per call)
_PIECE: Final = 64 * 1024
#: urllib3 refuses more than 5 links too: each link is another bomb multiplier
_MAX_CHAIN: Final = 5


class _Bounded:
    """Output accounting shared by the decoders: ``room`` left, None for unbounded."""

    __slots__ = ("_limit", "_room", "_seen")

    def __init__(self, max_output: int | None) -> None:
        self._limit = max_output
        self._room = max_output
        self._seen = False  # whether any input arrived (an empty body decodes to nothing)

    def _piece(self) -> int:
        """How much output to ask for next: one byte past the budget is enough to know."""
        room = self._room
        return _PIECE if room is None or room >= _PIECE else room + 1

    def _count(self, n: int) -> None:
        if self._room is not None:
            self._room -= n
            if self._room < 0:
                assert self._limit is not None
                raise DecodedTooLarge(self._limit)


class _IdentityDecoder(_Bounded):
    __slots__ = ()

    def decode(self, chunk: bytes) -> bytes:
        self._count(len(chunk))
        return chunk

    def flush(self) -> bytes:
        return b""


class _ZlibDecoder(_Bounded):
    """gzip (concatenated members allowed, RFC 1952 §2.2) or zlib/raw deflate.

    ``decompress(data, max_length)`` bounds each step; the input it did not reach waits in
    ``unconsumed_tail``.
    """

    __slots__ = ("_members", "_obj", "_wbits")

    def __init__(self, wbits: int, max_output: int | None, *, members: bool) -> None:
        super().__init__(max_output)
        self._wbits = wbits
        self._members = members
        self._obj = zlib.decompressobj(wbits)

    def decode(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        self._seen = True
        out: list[bytes] = []
        data = chunk
        try:
            while True:
                if self._obj.eof:
                    if not data:
                        break
                    if not self._members:
                        raise DecodeError("data after the end of the deflate stream")
                    self._obj = zlib.decompressobj(self._wbits)  # the next gzip member
                limit = self._piece()
                piece = self._obj.decompress(data, limit)
                if piece:
                    self._count(len(piece))
                    out.append(piece)
                if self._obj.eof:
                    data = self._obj.unused_data
                    continue
                data = self._obj.unconsumed_tail
                if not data and len(piece) < limit:
                    break  # input used up and nothing held back
        except zlib.error as exc:
            raise DecodeError(f"invalid {self._name()} data: {exc}") from exc
        return b"".join(out)

    def flush(self) -> bytes:
        if self._seen and not self._obj.eof:
            raise DecodeError(f"{self._name()} data is truncated")
        return b""

    def _name(self) -> str:
        return "gzip" if self._wbits > zlib.MAX_WBITS else "deflate"


def _is_zlib_header(cmf: int, flg: int) -> bool:
    """RFC 1950 §2.2: CM 8 (deflate), CINFO <= 7, FCHECK makes CMF*256+FLG a multiple of 31."""
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and ((cmf << 8) | flg) % 31 == 0


class _DeflateDecoder(_Bounded):
    """``deflate``: RFC 9110 says zlib-wrapped, but servers send raw deflate too (like httpx,
    accept both). The first two bytes decide, whatever the chunking."""

    __slots__ = ("_head", "_inner")

    def __init__(self, max_output: int | None) -> None:
        super().__init__(max_output)
        self._head = b""
        self._inner: _ZlibDecoder | None = None

    def decode(self, chunk: bytes) -> bytes:
        if self._inner is None:
            self._head += chunk
            if len(self._head) < 2:
                return b""
            wbits = zlib.MAX_WBITS if _is_zlib_header(self._head[0], self._head[1]) else -15
            self._inner = _ZlibDecoder(wbits, self._limit, members=False)
            chunk, self._head = self._head, b""
        return self._inner.decode(chunk)

    def flush(self) -> bytes:
        if self._inner is None:
            if self._head:
                raise DecodeError("deflate data is truncated")
            return b""
        return self._inner.flush()


class _BrotliDecoder(_Bounded):
    """``br``: ``process(data, output_buffer_limit=...)`` bounds each step (the buffer grows in
    ~32 KiB steps, so a step may pass the limit by that much). Output held back is handed out by
    ``process(b"")``; new input only once ``can_accept_more_data()``."""

    __slots__ = ("_d",)

    def __init__(self, max_output: int | None) -> None:
        super().__init__(max_output)
        self._d = brotli.Decompressor()

    def decode(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        self._seen = True
        d = self._d
        out: list[bytes] = []
        try:
            limit = self._piece()
            piece: bytes = d.process(chunk, output_buffer_limit=limit)
            while piece:
                self._count(len(piece))
                out.append(piece)
                # A piece short of the limit means the output is drained; one that reached it
                # may leave more behind, which only process(b"") hands out.
                if len(piece) < limit and d.can_accept_more_data():
                    break
                limit = self._piece()
                piece = d.process(b"", output_buffer_limit=limit)
        except brotli.error as exc:
            raise DecodeError(f"invalid br data: {exc}") from exc
        return b"".join(out)

    def flush(self) -> bytes:
        if self._seen and not self._d.is_finished():
            raise DecodeError("br data is truncated")
        return b""


# zstd frame walking (RFC 8878 §3.1): the library's streaming writer bounds memory but does not
# say where a frame ends, so a tiny walker over the block headers tracks it to detect truncation.
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_MAGIC, _FRAME_DESCRIPTOR, _FRAME_REST, _BLOCK, _CHECKSUM, _SKIPPABLE_SIZE = range(6)


class _ZstdFrames:
    __slots__ = ("_checksum", "_header", "_need", "_skip", "_state")

    def __init__(self) -> None:
        self._state = _MAGIC
        self._need = 4  # bytes of the next header to collect
        self._header = bytearray()
        self._skip = 0  # content bytes to pass over before that header
        self._checksum = False

    @property
    def at_boundary(self) -> bool:
        return self._state == _MAGIC and not self._skip and not self._header

    def feed(self, data: bytes) -> None:
        pos, end = 0, len(data)
        while pos < end:
            if self._skip:
                take = min(self._skip, end - pos)
                self._skip -= take
                pos += take
                continue
            take = min(self._need - len(self._header), end - pos)
            self._header += data[pos : pos + take]
            pos += take
            if len(self._header) == self._need:
                header = bytes(self._header)
                self._header.clear()
                self._advance(header)

    def _expect(self, state: int, need: int) -> None:
        self._state, self._need = state, need

    def _advance(self, h: bytes) -> None:
        state = self._state
        if state == _MAGIC:
            if h == _ZSTD_MAGIC:
                self._expect(_FRAME_DESCRIPTOR, 1)
            elif h[1:] == b"\x2a\x4d\x18" and h[0] & 0xF0 == 0x50:  # skippable 0x184D2A5?
                self._expect(_SKIPPABLE_SIZE, 4)
            else:
                raise DecodeError("invalid zstd data: not a zstd frame")
        elif state == _FRAME_DESCRIPTOR:
            d = h[0]
            single_segment = d & 0x20
            self._checksum = bool(d & 0x04)
            rest = (
                (0 if single_segment else 1)  # Window_Descriptor
                + (0, 1, 2, 4)[d & 0x03]  # Dictionary_ID
                + ((1 if single_segment else 0), 2, 4, 8)[d >> 6]  # Frame_Content_Size
            )
            if rest:
                self._expect(_FRAME_REST, rest)
            else:
                self._expect(_BLOCK, 3)
        elif state == _FRAME_REST:
            self._expect(_BLOCK, 3)
        elif state == _BLOCK:
            v = int.from_bytes(h, "little")
            kind = (v >> 1) & 0x03
            self._skip = 1 if kind == 1 else v >> 3  # an RLE block carries one byte
            if not v & 1:
                self._expect(_BLOCK, 3)
            elif self._checksum:
                self._expect(_CHECKSUM, 4)
            else:
                self._expect(_MAGIC, 4)
        elif state == _CHECKSUM:
            self._expect(_MAGIC, 4)
        else:  # _SKIPPABLE_SIZE
            self._skip = int.from_bytes(h, "little")
            self._expect(_MAGIC, 4)


class _Sink:
    """Where the zstd writer puts output, in ``write_size`` pieces: counting as it goes means a
    bomb stops within one piece of the limit (the exception propagates out of the C code)."""

    __slots__ = ("budget", "parts")

    def __init__(self, budget: _Bounded) -> None:
        self.budget = budget
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.budget._count(len(data))
        self.parts.append(data)
        return len(data)


class _ZstdDecompressorPool:
    __slots__ = ("_free",)

    def __init__(self) -> None:
        self._free: list[zstandard.ZstdDecompressor] = []

    def acquire(self) -> zstandard.ZstdDecompressor:
        if self._free:
            return self._free.pop()
        return zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)

    def release(self, dctx: zstandard.ZstdDecompressor) -> None:
        if len(self._free) < _POOL_MAX:
            self._free.append(dctx)


_ZSTD_DECOMPRESSORS: Final = _ZstdDecompressorPool()


class _ZstdDecoder(_Bounded):
    """``zstd``: ``decompressobj().decompress`` has no output bound (``write_size`` only sizes
    the pieces it joins), ``stream_reader`` takes an empty read as the end; ``stream_writer``
    hands output to a sink piece by piece, and the sink enforces the limit."""

    __slots__ = ("_dctx", "_frames", "_sink", "_writer")

    def __init__(self, max_output: int | None) -> None:
        super().__init__(max_output)
        self._dctx: zstandard.ZstdDecompressor | None = _ZSTD_DECOMPRESSORS.acquire()
        self._sink = _Sink(self)
        self._writer = self._dctx.stream_writer(
            cast(IO[bytes], self._sink), write_size=self._piece(), closefd=False
        )
        self._frames = _ZstdFrames()

    def decode(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        self._seen = True
        try:
            self._writer.write(chunk)
        except zstandard.ZstdError as exc:
            self._dctx = None  # mid-frame: never handed back to the pool
            raise DecodeError(f"invalid zstd data: {exc}") from exc
        except DecodedTooLarge:
            self._dctx = None
            raise
        self._frames.feed(chunk)
        parts = self._sink.parts
        if not parts:
            return b""
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        return out

    def flush(self) -> bytes:
        if not self._frames.at_boundary:
            self._dctx = None
            raise DecodeError("zstd data is truncated")
        if self._dctx is not None:
            dctx, self._dctx = self._dctx, None
            _ZSTD_DECOMPRESSORS.release(dctx)
        return b""


class _ChainDecoder:
    """Several codings, in the order to undo them (the reverse of the header's order)."""

    __slots__ = ("_limit", "_stages")

    def __init__(self, stages: list[Decoder], max_output: int | None) -> None:
        self._stages = stages
        self._limit = max_output

    def decode(self, chunk: bytes) -> bytes:
        try:
            for stage in self._stages:
                chunk = stage.decode(chunk)
        except DecodedTooLarge as exc:
            self._reraise(exc)
        return chunk

    def flush(self) -> bytes:
        data = b""
        try:
            for stage in self._stages:
                data = stage.decode(data) + stage.flush()
        except DecodedTooLarge as exc:
            self._reraise(exc)
        return data

    def _reraise(self, exc: DecodedTooLarge) -> NoReturn:
        # an intermediate stage has its own, larger bound: report the caller's limit
        if self._limit is None or exc.limit == self._limit:
            raise exc
        raise DecodedTooLarge(self._limit) from exc


def _gzip_decoder(max_output: int | None) -> Decoder:
    return _ZlibDecoder(16 + zlib.MAX_WBITS, max_output, members=True)


_DECODERS: Final[dict[str, Callable[[int | None], Decoder]]] = {
    "gzip": _gzip_decoder,
    "deflate": _DeflateDecoder,
    "br": _BrotliDecoder,
    "zstd": _ZstdDecoder,
}


def _codings(content_encoding: bytes | str) -> list[str]:
    """The header's codings, normalised, identity and empty list elements dropped."""
    text = (
        content_encoding.decode("latin-1")
        if isinstance(content_encoding, bytes)
        else content_encoding
    )
    names = (n.strip(" \t").lower() for n in text.split(","))
    return [_ALIASES.get(n, n) for n in names if n and n != "identity"]


def _make_decoder(
    codings: list[str], max_output: int | None, allowed: frozenset[str] | None = None
) -> Decoder:
    for name in codings:
        if name not in _DECODERS or (allowed is not None and name not in allowed):
            raise UnsupportedEncoding(f"unsupported content coding {name!r}")
    if len(codings) > _MAX_CHAIN:
        raise UnsupportedEncoding(f"more than {_MAX_CHAIN} content codings")
    if not codings:
        return _IdentityDecoder(max_output)
    if len(codings) == 1:
        decoder: Decoder = _DECODERS[codings[0]](max_output)
        return decoder
    # Intermediate outputs are coded data on their way to the last stage: bound them too (a
    # coded stream is at most a few bytes per 64 KiB larger than what it decodes to).
    inner = None if max_output is None else max_output + max_output // 8 + _PIECE
    order = codings[::-1]
    stages: list[Decoder] = [
        _DECODERS[name](max_output if i == len(order) - 1 else inner)
        for i, name in enumerate(order)
    ]
    return _ChainDecoder(stages, max_output)


def make_decoder(content_encoding: bytes | str, max_output: int | None = None) -> Decoder:
    """An incremental decoder for a ``Content-Encoding`` value.

    Codings are listed in the order they were applied (``"gzip, br"``: gzip first), so they are
    undone from the last. Supports br, zstd, gzip / x-gzip, deflate (zlib or raw) and identity.
    Raises :class:`UnsupportedEncoding` here; the decoder raises :class:`DecodeError` and
    :class:`DecodedTooLarge` (when the total output would pass ``max_output`` bytes).
    """
    return _make_decoder(_codings(content_encoding), max_output)


# ---------------------------------------------------------------- request bodies (docs/spec.md §9)

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
