"""gateway.encoding: Accept-Encoding negotiation, encoders, bounded incremental decoders."""

from __future__ import annotations

import asyncio
import functools
import gzip
import io
import itertools
import re
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from decimal import Decimal

import brotli
import orjson
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import encoding
from gateway.encoding import (
    MIN_COMPRESS_BYTES,
    DecodedTooLarge,
    DecodeError,
    UnsupportedEncoding,
    accepts,
    make_decoder,
    make_encoder,
    negotiate,
    negotiation,
    request_body_decoder,
)
from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from gateway.mock import engine

CODINGS = ("br", "zstd", "gzip")
PROFILES = [(c, s) for c in CODINGS for s in (False, True)]
SOME = settings(max_examples=60, deadline=None)

# ---------------------------------------------------------------- negotiate


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # absent / empty: identity
        (None, "identity"),
        (b"", "identity"),
        (b"   ", "identity"),
        (b",", "identity"),
        (b" , ,, ", "identity"),
        # single codings
        (b"br", "br"),
        (b"zstd", "zstd"),
        (b"gzip", "gzip"),
        (b"identity", "identity"),
        (b"x-gzip", "gzip"),
        # server preference on ties: br > zstd > gzip > identity
        (b"gzip, deflate, br, zstd", "br"),
        (b"gzip, deflate, br", "br"),
        (b"gzip, zstd", "zstd"),
        (b"zstd, br", "br"),
        (b"gzip, deflate", "gzip"),
        (b"identity, gzip", "gzip"),
        (b"br;q=0.5, zstd;q=0.5, gzip;q=0.5", "br"),
        (b"gzip;q=0.5, zstd;q=0.5", "zstd"),
        (b"identity;q=0.5, gzip;q=0.5", "gzip"),
        # identity that is not listed is only the fallback: any listed coding beats it
        (b"gzip;q=0.5", "gzip"),
        (b"br;q=0.001", "br"),
        (b"zstd;q=0.1, deflate", "zstd"),
        # the highest q wins otherwise
        (b"br;q=0.5, gzip;q=0.8", "gzip"),
        (b"br;q=0.8, zstd;q=0.9, gzip;q=0.7", "zstd"),
        (b"gzip;q=1.0, br;q=0.999", "gzip"),
        (b"gzip;q=1, br;q=0.5", "gzip"),
        (b"identity, gzip;q=0.9", "identity"),
        (b"br;q=0.001, identity;q=0", "br"),
        (b"zstd;q=0.002, br;q=0.001", "zstd"),
        # unsupported codings only: identity stays implicitly acceptable
        (b"deflate", "identity"),
        (b"compress, deflate", "identity"),
        (b"lzma;q=1", "identity"),
        # exclusions
        (b"identity;q=0", None),
        (b"identity;q=0, deflate", None),
        (b"br;q=0", "identity"),
        (b"br;q=0, identity;q=0", None),
        (b"gzip;q=0, identity;q=0.0", None),
        # "*": any coding not listed, identity included
        (b"*", "br"),
        (b"*;q=0", None),
        (b"*;q=0, gzip", "gzip"),
        (b"*;q=0, identity", "identity"),
        (b"*, br;q=0", "zstd"),
        (b"*, br;q=0, zstd;q=0", "gzip"),
        (b"*, br;q=0, zstd;q=0, gzip;q=0", "identity"),
        (b"*;q=0.5, gzip", "gzip"),
        (b"*;q=0.5, identity;q=0.6", "identity"),
        (b"*;q=0.1, identity;q=0", "br"),
        (b"identity;q=0, *;q=0", None),
        (b"zstd;q=0.3, *;q=0.2", "zstd"),
        (b"deflate, *;q=0", None),
        # case-insensitive, whitespace tolerant
        (b"GZIP", "gzip"),
        (b"Br;Q=1", "br"),
        (b"X-GZIP;Q=0.5, identity;q=0.4", "gzip"),
        (b"ZStd ; q=0.7 , GZip ;q=0.6", "zstd"),
        (b"  gzip  ;  q=0.5  ,  br ; q = 0.4 ", "gzip"),
        (b"\tbr\t;\tq=0.9\t", "br"),
        (b"gzip,br", "br"),
        # q-value grammar: 0..1, at most 3 decimals; a malformed element is ignored
        (b"gzip;q=1.5, br;q=0.1", "br"),
        (b"gzip;q=2", "identity"),
        (b"gzip;q=-1", "identity"),
        (b"gzip;q=.5", "identity"),
        (b"gzip;q=1.001", "identity"),
        (b"gzip;q=0.1234, zstd", "zstd"),
        (b"gzip;q=abc", "identity"),
        (b"gzip;q=, br", "br"),
        (b"gzip;q", "identity"),
        (b"gzip;q=0.5x", "identity"),
        (b"gzip;q=0.", "identity"),
        (b"gzip;q=1.", "gzip"),
        (b"gzip;q=1.000", "gzip"),
        (b"gzip;q=0.000, br;q=0", "identity"),
        (b"identity;q=bad", "identity"),  # a malformed exclusion does not exclude
        (b"*;q=nope", "identity"),
        # garbage elements are skipped, the rest still counts
        (b"g zip, br", "br"),
        (b"gzip\x00, zstd", "zstd"),
        (b"\xff\xfe, br", "br"),
        (b"gzip/1, gzip", "gzip"),
        (b";q=1, zstd", "zstd"),
        (b"=, gzip", "gzip"),
        (b"gzip;level=9", "gzip"),  # parameters other than q are tolerated
        (b"gzip;, br;q=0.5", "gzip"),
        # a coding listed twice: the lower weight wins, whatever the order
        (b"gzip, gzip;q=0", "identity"),
        (b"gzip;q=0, gzip", "identity"),
        (b"gzip;q=0, x-gzip", "identity"),
        (b"br;q=0.2, br;q=0.9, gzip;q=0.5", "gzip"),
    ],
)
def test_negotiate(header: bytes | None, expected: str | None) -> None:
    assert negotiate(header) == expected
    assert negotiate(header) == expected  # the cached answer is the same


@pytest.mark.parametrize(
    ("header", "coding", "expected"),
    [
        (None, "identity", True),
        (None, "gzip", False),
        (b"", "identity", True),
        (b"", "br", False),
        (b"gzip, deflate", "deflate", True),
        (b"gzip, deflate", "gzip", True),
        (b"gzip, deflate", "x-gzip", True),
        (b"gzip", "br", False),
        (b"x-gzip", "gzip", True),
        (b"GZIP", "Gzip", True),
        (b"gzip;q=0", "gzip", False),
        (b"*", "deflate", True),
        (b"*;q=0.1", "compress", True),
        (b"*;q=0, gzip", "br", False),
        (b"*, br;q=0", "br", False),
        (b"identity;q=0", "identity", False),
        (b"br", "identity", True),
        (b"br, gzip", "gzip, br", True),
        (b"br", "gzip, br", False),
        (b"br", b"br", True),
        (b"br", " BR ", True),
        (b"gzip", "", True),  # no coding at all is identity
        (b"gzip;q=bad", "gzip", False),
    ],
)
def test_accepts(header: bytes | None, coding: str | bytes, expected: bool) -> None:
    assert accepts(header, coding) is expected
    assert accepts(header, coding) is expected


def test_negotiation_cache_is_bounded() -> None:
    for i in range(3000):
        header = f"gzip;q=0.{i % 1000:03d}, x-{i}".encode()
        assert negotiate(header) == ("gzip" if i % 1000 else "identity")
        assert accepts(header, "gzip") is bool(i % 1000)
        assert len(negotiation._PREFERENCES) <= negotiation._CACHE_MAX
        assert len(negotiation._ACCEPTS) <= negotiation._CACHE_MAX


def test_long_header_values_are_answered_but_not_cached() -> None:
    header = b", ".join([b"x-unknown-%d" % i for i in range(100)] + [b"zstd"])
    assert len(header) > negotiation._CACHEABLE_LEN
    assert negotiate(header) == "zstd"
    assert header not in negotiation._PREFERENCES


# An independent reference for the property tests: regexes and Decimal instead of byte ops.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


def reference_weights(header: bytes) -> Callable[[str], Decimal]:
    explicit: dict[str, Decimal] = {}
    star: Decimal | None = None
    for element in header.decode("latin-1").split(","):
        coding, *params = element.split(";")
        coding = coding.strip(" \t")
        if not _TOKEN.fullmatch(coding):
            continue
        coding = coding.lower()
        coding = "gzip" if coding == "x-gzip" else coding
        q: Decimal | None = Decimal(1)
        for param in params:
            name, sep, value = param.partition("=")
            if name.strip(" \t").lower() == "q":
                value = value.strip(" \t")
                q = Decimal(value.rstrip(".")) if sep and _QVALUE.fullmatch(value) else None
                if q is None:
                    break
        if q is None:
            continue
        if coding == "*":
            star = q if star is None else min(star, q)
        else:
            explicit[coding] = min(q, explicit.get(coding, q))

    def weight(coding: str) -> Decimal:
        if coding in explicit:
            return explicit[coding]
        if star is not None:
            return star
        # implicit identity: acceptable, but only as the fallback (the lowest weight)
        return Decimal("0.001") if coding == "identity" else Decimal(0)

    return weight


CANDIDATE_CODINGS = [
    "br",
    "zstd",
    "gzip",
    "x-gzip",
    "identity",
    "*",
    "deflate",
    "compress",
    "BR",
    "GZip",
    "Identity",
    "X-Gzip",
    "ZSTD",
    "g zip",
    "",
    "br/1",
]
QVALUES = ["0", "1", "0.5", "0.001", "0.999", "1.000", "0.", "1.", "0.50", "0.0"]
BAD_QVALUES = ["1.5", "2", "-1", "0.1234", ".5", "abc", "", "1.01", "0,5"]


@st.composite
def accept_elements(draw: st.DrawFn) -> str:
    coding = draw(st.sampled_from(CANDIDATE_CODINGS) | st.from_regex(_TOKEN, fullmatch=True))
    ws = st.sampled_from(["", " ", "\t", "  "])
    element = draw(ws) + coding + draw(ws)
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["q", "Q", "bad", "other"]))
        if kind == "other":
            element += f";level={draw(st.integers(0, 9))}"
        else:
            value = draw(st.sampled_from(BAD_QVALUES if kind == "bad" else QVALUES))
            element += f"{draw(ws)};{draw(ws)}{'Q' if kind == 'Q' else 'q'}={value}{draw(ws)}"
    return element


@SOME
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_negotiate_never_raises(header: bytes) -> None:
    result = negotiate(header)
    assert result in (None, "br", "zstd", "gzip", "identity")
    for coding in ("br", "zstd", "gzip", "identity", "deflate", "x-gzip"):
        assert isinstance(accepts(header, coding), bool)


@settings(max_examples=300, deadline=None)
@given(st.lists(accept_elements(), max_size=8))
def test_negotiate_matches_reference(elements: list[str]) -> None:
    header = ", ".join(elements).encode()
    weight = reference_weights(header)
    result = negotiate(header)
    weights = {c: weight(c) for c in ("br", "zstd", "gzip", "identity")}
    if result is None:
        assert all(w == 0 for w in weights.values())
    else:
        assert weights[result] > 0  # acceptable
        assert weights[result] == max(weights.values())  # and the most wanted
        # ties go to the earliest in br > zstd > gzip > identity
        assert result == next(c for c, w in weights.items() if w == weights[result])
    for coding in ("br", "zstd", "gzip", "identity", "deflate"):
        assert accepts(header, coding) is (weight(coding) > 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(accept_elements(), min_size=1, max_size=8), st.data())
def test_negotiate_ignores_element_order(elements: list[str], data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(elements))
    assert negotiate(",".join(elements).encode()) == negotiate(",".join(shuffled).encode())


# ---------------------------------------------------------------- encoders


def reference_decode(coding: str, data: bytes) -> bytes:
    if coding == "br":
        out: bytes = brotli.decompress(data)
        return out
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if coding == "gzip":
        return gzip.decompress(data)
    raise AssertionError(coding)


def encode_all(coding: str, parts: list[bytes], *, stream: bool = False) -> bytes:
    enc = make_encoder(coding, stream=stream)
    out = [enc.encode(p) + (enc.flush() if stream else b"") for p in parts]
    return b"".join(out) + enc.finish()


def text(n: int) -> bytes:
    words = b"gateway streams tokens traced spans latency cache router upstream edge".split()
    return b" ".join(words[(i * 7 + i // 3) % len(words)] for i in range(n // 6 + 1))[:n]


def test_min_compress_bytes() -> None:
    assert MIN_COMPRESS_BYTES == 1024


@pytest.mark.parametrize(("coding", "stream"), PROFILES)
def test_encoder_headers(coding: str, stream: bool) -> None:
    assert make_encoder(coding, stream=stream).headers == [(b"content-encoding", coding.encode())]


def test_identity_encoder() -> None:
    enc = make_encoder("identity")
    assert enc.headers == []
    assert enc.encode(b"abc") == b"abc"
    assert enc.flush() == b"" and enc.finish() == b""


def test_unknown_coding_cannot_be_encoded() -> None:
    with pytest.raises(UnsupportedEncoding):
        make_encoder("deflate")
    assert issubclass(UnsupportedEncoding, ValueError)


@pytest.mark.parametrize(("coding", "stream"), PROFILES)
@pytest.mark.parametrize("size", [0, 1, 1500, 30_000, 300_000])
def test_encoder_round_trip(coding: str, stream: bool, size: int) -> None:
    data = text(size)
    parts = [data[i : i + 7000] for i in range(0, len(data), 7000)] or [b""]
    coded = encode_all(coding, parts, stream=stream)
    assert reference_decode(coding, coded) == data
    decoder = make_decoder(coding)
    assert decoder.decode(coded) + decoder.flush() == data
    if size >= 1500:
        assert len(coded) < len(data) / 2


@pytest.mark.parametrize(("coding", "stream"), PROFILES)
def test_encoder_round_trip_incompressible(coding: str, stream: bool) -> None:
    data = bytes(range(256)) * 4 + zlib.compress(text(200_000), 9)
    coded = encode_all(coding, [data[:5000], data[5000:]], stream=stream)
    assert reference_decode(coding, coded) == data
    decoder = make_decoder(coding, max_output=len(data))
    assert decoder.decode(coded) + decoder.flush() == data


def mock_sse_events() -> list[bytes]:
    body = {"model": "mock-gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    reply = engine.reply(
        "POST", "/chat/completions", orjson.dumps({**body, "stream": True, "max_tokens": 40})
    )
    assert reply.events is not None
    events = reply.events

    async def collect() -> list[bytes]:
        return [e async for e in events]

    return asyncio.run(collect())


def reference_prefix(coding: str, data: bytes) -> bytes:
    """What a client's incremental decoder yields for the bytes it has so far."""
    if coding == "br":
        out: bytes = brotli.Decompressor().process(data)
        return out
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)


def check_flushed_events(coding: str, stream: bool, events: list[bytes]) -> None:
    enc = make_encoder(coding, stream=stream)
    sent = b""
    for i, event in enumerate(events):
        sent += enc.encode(event) + enc.flush()
        so_far = b"".join(events[: i + 1])
        assert reference_prefix(coding, sent) == so_far
        assert make_decoder(coding).decode(sent) == so_far
    sent += enc.finish()
    assert reference_decode(coding, sent) == b"".join(events)


@pytest.mark.parametrize(("coding", "stream"), PROFILES)
def test_flush_makes_every_sse_event_decodable(coding: str, stream: bool) -> None:
    check_flushed_events(coding, stream, mock_sse_events())


@SOME
@given(
    st.sampled_from(PROFILES),
    st.lists(st.binary(min_size=1, max_size=300) | st.just(b"data: [DONE]\n\n"), max_size=12),
)
def test_flush_makes_arbitrary_events_decodable(
    profile: tuple[str, bool], events: list[bytes]
) -> None:
    check_flushed_events(*profile, events)


def test_zstd_encoders_interleaved_and_reused() -> None:
    a, b = make_encoder("zstd"), make_encoder("zstd")
    out_a = a.encode(text(5000)) + a.flush()
    out_b = b.encode(b"other " * 500) + b.flush()
    out_a += a.encode(b"tail") + a.finish()
    out_b += b.finish()
    assert reference_decode("zstd", out_a) == text(5000) + b"tail"
    assert reference_decode("zstd", out_b) == b"other " * 500
    c = make_encoder("zstd")  # takes a compressor a or b gave back
    assert reference_decode("zstd", c.encode(b"again") + c.finish()) == b"again"


def test_zstd_encoder_cannot_be_finished_twice() -> None:
    pool = encoding.ZstdCompressorPool(3)
    enc = encoding.ZstdEncoder(pool)
    enc.encode(b"x" * 100)
    enc.finish()
    assert len(pool._free) == 1
    with pytest.raises(zstandard.ZstdError):
        enc.finish()
    with pytest.raises(zstandard.ZstdError):
        enc.encode(b"more")
    assert len(pool._free) == 1  # handed back once: no two encoders will share it


# ---------------------------------------------------------------- decoders

SAMPLE = text(200_000)


def zstd_frames(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


CODED = {
    "gzip": gzip.compress(SAMPLE),
    "x-gzip": gzip.compress(SAMPLE),
    "br": brotli.compress(SAMPLE, quality=5),
    "zstd": zstd_frames(SAMPLE),
    "deflate": zlib.compress(SAMPLE),
    "identity": SAMPLE,
}


def raw_deflate(data: bytes) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


def decode_pieces(coding: str | bytes, pieces: Iterator[bytes] | list[bytes], **kw: int) -> bytes:
    decoder = make_decoder(coding, **kw)
    out = b"".join(decoder.decode(p) for p in pieces)
    return out + decoder.flush()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@pytest.mark.parametrize("coding", sorted(CODED))
def test_decoder_whole_and_bytewise(coding: str) -> None:
    coded = CODED[coding][:6000] if coding == "identity" else CODED[coding]
    expected = SAMPLE[:6000] if coding == "identity" else SAMPLE
    assert decode_pieces(coding, [coded]) == expected
    if len(coded) < 20_000:
        assert decode_pieces(coding, [coded[i : i + 1] for i in range(len(coded))]) == expected


@pytest.mark.parametrize("value", ["gzip", b"gzip", "GZIP", " gzip ", "x-gzip", "X-Gzip"])
def test_decoder_header_forms(value: str | bytes) -> None:
    assert decode_pieces(value, [CODED["gzip"]]) == SAMPLE


def test_deflate_zlib_and_raw() -> None:
    for coded in (zlib.compress(SAMPLE), raw_deflate(SAMPLE), zlib.compress(b"x", 1)):
        expected = b"x" if len(coded) < 20 else SAMPLE
        assert decode_pieces("deflate", [coded]) == expected
        assert decode_pieces("deflate", [coded[:1], coded[1:2], coded[2:]]) == expected


@SOME
@given(
    st.sampled_from(["gzip", "br", "zstd", "deflate", "raw-deflate", "identity"]),
    st.binary(max_size=3000) | st.integers(0, 80_000).map(text),
    st.lists(st.integers(0, 1 << 20), max_size=20),
)
def test_decoders_are_chunk_boundary_independent(coding: str, data: bytes, cuts: list[int]) -> None:
    coded = {
        "gzip": lambda d: gzip.compress(d),
        "br": lambda d: brotli.compress(d, quality=4),
        "zstd": zstd_frames,
        "deflate": lambda d: zlib.compress(d),
        "raw-deflate": raw_deflate,
        "identity": lambda d: d,
    }[coding](data)
    name = "deflate" if coding == "raw-deflate" else coding
    assert decode_pieces(name, split(coded, cuts)) == data
    assert decode_pieces(name, split(coded, cuts), max_output=len(data)) == data


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate", "identity"])
def test_empty_body_decodes_to_nothing(coding: str) -> None:
    decoder = make_decoder(coding, max_output=0)
    assert decoder.decode(b"") == b""
    assert decoder.flush() == b""


@pytest.mark.parametrize(
    ("coding", "coded"),
    [
        ("gzip", gzip.compress(b"")),
        ("br", brotli.compress(b"")),
        ("zstd", zstandard.ZstdCompressor().compress(b"")),
        ("deflate", zlib.compress(b"")),
    ],
)
def test_empty_payload_streams(coding: str, coded: bytes) -> None:
    assert decode_pieces(coding, [coded], max_output=0) == b""


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate", "identity"])
@pytest.mark.parametrize("size", [1, 1000, 65_536, 65_537, 200_000])
def test_max_output_is_inclusive(coding: str, size: int) -> None:
    data = SAMPLE[:size]
    coded = {
        "gzip": gzip.compress,
        "br": brotli.compress,
        "zstd": zstd_frames,
        "deflate": zlib.compress,
        "identity": bytes,
    }[coding](data)
    assert decode_pieces(coding, [coded], max_output=size) == data
    with pytest.raises(DecodedTooLarge):
        decode_pieces(coding, [coded], max_output=size - 1)
    pieces = [coded[i : i + 512] for i in range(0, len(coded), 512)]
    with pytest.raises(DecodedTooLarge):
        decode_pieces(coding, pieces, max_output=size - 1)


@functools.cache
def bomb(coding: str) -> bytes:
    """50 MB of zeros, coded without ever holding the 50 MB."""
    block = bytes(1 << 20)
    if coding == "br":
        c = brotli.Compressor(quality=5)
        out = b"".join(c.process(block) for _ in range(50))
        return out + c.finish()
    if coding == "zstd":
        z = zstandard.ZstdCompressor(level=3).compressobj()
        return b"".join(z.compress(block) for _ in range(50)) + z.flush()
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}[coding]
    d = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join(d.compress(block) for _ in range(50)) + d.flush()


def peak_while(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate"])
@pytest.mark.parametrize("chunk", [None, 1024])
def test_decompression_bomb_is_refused_in_bounded_memory(coding: str, chunk: int | None) -> None:
    coded = bomb(coding)
    assert len(coded) < 100_000  # it is a bomb: > 500x
    produced = 0

    def run() -> None:
        nonlocal produced
        decoder = make_decoder(coding, max_output=1 << 20)
        pieces = (
            [coded]
            if chunk is None
            else (coded[i : i + chunk] for i in range(0, len(coded), chunk))
        )
        with pytest.raises(DecodedTooLarge) as err:
            for piece in pieces:
                produced += len(decoder.decode(piece))
        assert err.value.limit == 1 << 20

    peak = peak_while(run)
    assert produced <= 1 << 20
    assert peak < 8 << 20, f"peak {peak} bytes"


def test_chained_bomb_is_refused_in_bounded_memory() -> None:
    # a gzip bomb wrapped in br: the intermediate output is bounded too
    coded = brotli.compress(bomb("gzip"), quality=5)
    produced = 0

    def run() -> None:
        nonlocal produced
        decoder = make_decoder("gzip, br", max_output=1 << 20)
        with pytest.raises(DecodedTooLarge):
            produced += len(decoder.decode(coded))

    assert peak_while(run) < 8 << 20
    assert produced == 0


def test_stored_gzip_wrapped_in_zstd_bounds_the_intermediate_output() -> None:
    # gzip level 0 of 50 MB of zeros is a 50 MB gzip stream that zstd squeezes to almost
    # nothing: the zstd stage's own output must be bounded, not only the final gzip output.
    stored = zlib.compressobj(0, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    outer = zstandard.ZstdCompressor(level=3).compressobj()
    block = bytes(1 << 20)
    coded = b"".join(outer.compress(stored.compress(block)) for _ in range(50))
    coded += outer.compress(stored.flush()) + outer.flush()
    assert len(coded) < 100_000

    def run() -> None:
        with pytest.raises(DecodedTooLarge) as err:
            make_decoder("gzip, zstd", max_output=1 << 20).decode(coded)
        assert err.value.limit == 1 << 20  # the caller's limit, not the stage's

    assert peak_while(run) < 8 << 20


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_zlib_output_held_back_at_a_chunk_end_is_not_lost(coding: str) -> None:
    # Long runs decode to many 258-byte matches: when a 64 KiB step fills in the middle of the
    # last match a chunk carries, zlib holds the rest although no input is left.
    data = bytes(150_000) + b"end" + bytes(70_000)
    coded = gzip.compress(data) if coding == "gzip" else zlib.compress(data)
    wbits = 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
    for cut in range(len(coded) + 1):
        decoder = make_decoder(coding)
        first = decoder.decode(coded[:cut])
        # everything the bytes so far can give, as an unbounded zlib gives it
        assert first == zlib.decompressobj(wbits).decompress(coded[:cut])
        assert first + decoder.decode(coded[cut:]) + decoder.flush() == data


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate"])
def test_truncated_input_fails_on_flush(coding: str) -> None:
    coded = {
        "gzip": gzip.compress(text(3000)),
        "br": brotli.compress(text(3000)),
        "zstd": zstandard.ZstdCompressor(write_checksum=True).compress(text(3000)),
        "deflate": zlib.compress(text(3000)),
    }[coding]
    for cut in range(1, len(coded)):
        decoder = make_decoder(coding)
        with pytest.raises(DecodeError):
            decoder.decode(coded[:cut])
            decoder.flush()
    decoder = make_decoder(coding)
    assert decoder.decode(coded) + decoder.flush() == text(3000)


@pytest.mark.parametrize(("coding", "stream"), PROFILES)
def test_stream_cut_after_a_flush_is_truncated(coding: str, stream: bool) -> None:
    enc = make_encoder(coding, stream=stream)
    sent = enc.encode(b"data: {}\n\n") + enc.flush()
    decoder = make_decoder(coding)
    assert decoder.decode(sent) == b"data: {}\n\n"
    with pytest.raises(DecodeError):
        decoder.flush()


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate"])
@pytest.mark.parametrize(
    "garbage", [b"this is not compressed at all", b"\xff" * 64, b"\x00" * 64, b"\x1f\x8b\x08"]
)
def test_corrupt_input_is_a_decode_error(coding: str, garbage: bytes) -> None:
    decoder = make_decoder(coding)
    with pytest.raises(DecodeError):
        decoder.decode(garbage)
        decoder.flush()


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate"])
def test_corrupted_middle_is_a_decode_error(coding: str) -> None:
    data = text(5000)
    coded = bytearray(
        {
            "gzip": gzip.compress,
            "br": brotli.compress,
            "zstd": zstandard.ZstdCompressor(write_checksum=True).compress,
            "deflate": zlib.compress,
        }[coding](data)
    )
    coded[len(coded) // 2] ^= 0xFF
    decoder = make_decoder(coding)
    try:
        out = decoder.decode(bytes(coded)) + decoder.flush()
    except DecodeError:
        return
    # br has no checksum: a flipped byte may decode, but never to the original
    assert coding == "br" and out != data


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate"])
def test_trailing_garbage_is_a_decode_error(coding: str) -> None:
    coded = CODED[coding] + b"trailing junk"
    with pytest.raises(DecodeError):
        decode_pieces(coding, [coded])
    with pytest.raises(DecodeError):
        decode_pieces(coding, [CODED[coding], b"trailing junk"])


@SOME
@given(st.sampled_from(["gzip", "br", "zstd", "deflate"]), st.binary(max_size=500))
def test_arbitrary_input_only_raises_decode_errors(coding: str, data: bytes) -> None:
    decoder = make_decoder(coding, max_output=10_000)
    try:
        decoder.decode(data)
        decoder.flush()
    except (DecodeError, DecodedTooLarge):
        pass


def test_gzip_members_are_concatenated() -> None:
    coded = gzip.compress(b"first ") + gzip.compress(b"second ") + gzip.compress(b"")
    assert decode_pieces("gzip", [coded]) == b"first second "
    assert decode_pieces("gzip", [coded[i : i + 3] for i in range(0, len(coded), 3)]) == (
        b"first second "
    )
    with pytest.raises(DecodeError):
        decode_pieces("gzip", [coded + gzip.compress(b"cut")[:-2]])


ZSTD_FRAMES = [
    zstandard.ZstdCompressor().compress(b"known size"),  # single segment, 1-byte size
    zstandard.ZstdCompressor().compress(text(1000)),  # 2-byte content size
    zstandard.ZstdCompressor().compress(text(70_000)),  # 4-byte content size
    zstandard.ZstdCompressor(write_checksum=True).compress(text(5000)),
    zstandard.ZstdCompressor(write_content_size=False).compress(text(5000)),
    zstandard.ZstdCompressor(level=19).compress(text(300_000)),
    zstandard.ZstdCompressor().compress(b""),
    # a skippable frame (magic 0x184D2A5?, 4-byte size, content)
    b"\x5a\x2a\x4d\x18" + (5).to_bytes(4, "little") + b"12345",
    b"\x50\x2a\x4d\x18" + (0).to_bytes(4, "little"),
]


def zstd_expected(frame: bytes) -> bytes:
    return b"".join(zstandard.ZstdDecompressor().read_to_iter(io.BytesIO(frame)))


@SOME
@given(
    st.lists(st.sampled_from(range(len(ZSTD_FRAMES))), min_size=1, max_size=4),
    st.lists(st.integers(0, 1 << 20), max_size=30),
)
def test_zstd_frame_sequences(indexes: list[int], cuts: list[int]) -> None:
    frames = [ZSTD_FRAMES[i] for i in indexes]
    coded = b"".join(frames)
    expected = b"".join(zstd_expected(f) if f[:1] == b"\x28" else b"" for f in frames)
    assert decode_pieces("zstd", split(coded, cuts)) == expected
    if len(coded) > 1:
        with pytest.raises(DecodeError):
            decode_pieces("zstd", [coded[:-1]])


def test_zstd_window_over_rfc9659_limit_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    z = zstandard.ZstdCompressor(compression_params=params).compressobj()
    coded = z.compress(b"x" * 1000) + z.flush()
    assert zstandard.get_frame_parameters(coded).window_size > 8 << 20
    with pytest.raises(DecodeError):
        decode_pieces("zstd", [coded])


def test_zstd_decoders_interleaved_and_reused() -> None:
    a, b = make_decoder("zstd"), make_decoder("zstd")
    ca, cb = zstd_frames(text(50_000)), zstd_frames(b"second " * 1000)
    out_a = a.decode(ca[:100])
    out_b = b.decode(cb[:100])
    out_a += a.decode(ca[100:]) + a.flush()
    out_b += b.decode(cb[100:]) + b.flush()
    assert (out_a, out_b) == (text(50_000), b"second " * 1000)
    for _ in range(3):  # decompressors handed back by flush() serve the next bodies
        assert decode_pieces("zstd", [ca]) == text(50_000)


@pytest.mark.parametrize(
    ("header", "apply"),
    [
        ("gzip, br", ["gzip", "br"]),
        ("br, gzip", ["br", "gzip"]),
        ("zstd, gzip", ["zstd", "gzip"]),
        ("deflate, zstd, br", ["deflate", "zstd", "br"]),
        ("gzip, gzip", ["gzip", "gzip"]),
        ("identity, gzip, identity", ["gzip"]),
        ("gzip,,br", ["gzip", "br"]),
        ("identity", []),
        ("", []),
    ],
)
def test_chains_decode_in_reverse(header: str, apply: list[str]) -> None:
    coders = {
        "gzip": gzip.compress,
        "br": brotli.compress,
        "zstd": zstd_frames,
        "deflate": zlib.compress,
    }
    data = coded = text(20_000)
    for name in apply:
        coded = coders[name](coded)
    assert decode_pieces(header, [coded]) == data
    assert decode_pieces(header, split(coded, [7, 100, 5000]), max_output=len(data)) == data
    with pytest.raises(DecodedTooLarge):
        decode_pieces(header, [coded], max_output=len(data) - 1)
    if len(set(apply)) > 1:
        with pytest.raises(DecodeError):
            decode_pieces(", ".join(reversed(apply)), [coded])


def test_chain_truncation_is_detected() -> None:
    coded = brotli.compress(gzip.compress(text(5000)))
    with pytest.raises(DecodeError):
        decode_pieces("gzip, br", [coded[:-1]])


@pytest.mark.parametrize(
    "header", ["compress", "x-compress", "lzma", "gzip, lzma", "br;q=1", "*", "gzip, " * 6]
)
def test_unsupported_codings(header: str) -> None:
    with pytest.raises(UnsupportedEncoding):
        make_decoder(header)


def test_error_types_are_value_errors() -> None:
    for exc in (UnsupportedEncoding, DecodeError, DecodedTooLarge):
        assert issubclass(exc, ValueError)


# ---------------------------------------------------------------- request bodies


@pytest.mark.parametrize(
    ("header", "coded"),
    [
        (b"gzip", gzip.compress(b'{"model": "m"}')),
        (b"x-gzip", gzip.compress(b'{"model": "m"}')),
        (b"br", brotli.compress(b'{"model": "m"}')),
        (b"zstd", zstd_frames(b'{"model": "m"}')),
        (b"ZSTD", zstd_frames(b'{"model": "m"}')),
        (b"identity", b'{"model": "m"}'),
        (b"", b'{"model": "m"}'),
        (b"gzip, br", brotli.compress(gzip.compress(b'{"model": "m"}'))),
    ],
)
def test_request_body_decoder(header: bytes, coded: bytes) -> None:
    decoder = request_body_decoder(header, 1000)
    out = b"".join(decoder.decode(coded[i : i + 4]) for i in range(0, len(coded), 4))
    assert out + decoder.flush() == b'{"model": "m"}'


@pytest.mark.parametrize("header", [b"deflate", b"compress", b"gzip, deflate", b"snappy"])
def test_request_body_unsupported_coding_is_415(header: bytes) -> None:
    with pytest.raises(UnsupportedMediaType) as err:
        request_body_decoder(header, 1000)
    assert err.value.status == 415
    assert err.value.code == "unsupported_content_encoding"
    assert header.decode() in err.value.message


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_request_body_bomb_is_413(coding: str) -> None:
    decoder = request_body_decoder(coding.encode(), 1 << 20)

    def run() -> None:
        with pytest.raises(PayloadTooLarge) as err:
            decoder.decode(bomb(coding))
        assert err.value.status == 413
        assert err.value.code == "body_too_large"
        assert isinstance(err.value.__cause__, DecodedTooLarge)

    assert peak_while(run) < 8 << 20


def test_request_body_over_limit_identity_is_413() -> None:
    decoder = request_body_decoder(b"identity", 10)
    decoder.decode(b"12345")
    with pytest.raises(PayloadTooLarge):
        decoder.decode(b"678901")


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_request_body_corrupt_or_truncated_is_400(coding: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        d = request_body_decoder(coding.encode(), 1000)
        d.decode(b"\xff" * 32 + b"not compressed")
        d.flush()
    assert err.value.status == 400
    assert err.value.code == "invalid_content_encoding"
    assert isinstance(err.value.__cause__, DecodeError)
    coded = {"gzip": gzip.compress, "br": brotli.compress, "zstd": zstd_frames}[coding](b"{}" * 50)
    d = request_body_decoder(coding.encode(), 1000)
    d.decode(coded[:-1])
    with pytest.raises(InvalidRequest) as err:
        d.flush()
    assert err.value.code == "invalid_content_encoding"
