"""Decoders: ``decode(chunk)`` and ``flush()`` (end of input: raises when the coded stream is
truncated) for br, zstd, gzip / x-gzip, deflate and chains of them. Each bounds what it
materialises, so a decompression bomb costs at most about ``max_output`` bytes of memory."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import IO, Final, NoReturn, Protocol, cast

import brotli  # type: ignore[import-untyped]  # brotli 1.2 ships no type information
import zstandard

from gateway.encoding.codings import DecodedTooLarge, DecodeError, UnsupportedEncoding, _codings
from gateway.encoding.levels import _POOL_MAX, ZSTD_MAX_WINDOW


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
