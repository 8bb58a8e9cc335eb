"""Compression benchmark: bytes saved and CPU per Content-Encoding, per coding and level (SPEC §9).

    python loadtests/compression.py [--budget 0.3] [--no-rss]

Shapes, all produced by the built-in mock engine (``gateway.mock.engine.reply``):

- ``embeddings``: one input, 1536 float dimensions, ``encoding_format: float`` (~30 KB JSON);
- ``embeddings-b64``: the same vector as the openai SDK asks for it (base64 float32, ~8 KB);
- ``chat``: a ``chat.completion`` with ``max_tokens: 200`` (~1.6 KB);
- ``sse``: the same answer streamed, ~200 ``chat.completion.chunk`` events, encoded the way the
  relay does it: ``encode(event) + flush()`` per event, then ``finish()``.

Per shape and coder it prints the coded size, the bytes saved, and the CPU per response: the median
``time.process_time`` of one whole response (making the encoder included, as the gateway does it
per response) over as many iterations as fit in ``--budget`` seconds (at least 5, at most 2000),
after a warm-up. For ``sse`` it also prints the resident memory one live stream's encoder holds
(``KiB/stream``: 200 encoders that have each sent one event, measured in a fresh child process),
since a stream's encoder lives as long as the stream. ``*`` marks the gateway's defaults
(``gateway.encoding.levels``: body levels for the bodies, the stream profile for ``sse``).

Nothing here is a test: numbers vary with the machine; read them as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import brotli  # type: ignore[import-untyped]  # brotli 1.2 ships no type information
import orjson
import zstandard

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway import encoding as enc  # noqa: E402
from gateway.encoding import levels  # noqa: E402
from gateway.mock import engine  # noqa: E402

MIN_ITERATIONS = 5
MAX_ITERATIONS = 2000
RSS_ENCODERS = 200
SHAPES = ("embeddings", "embeddings-b64", "chat", "sse")


@dataclass(frozen=True)
class Coder:
    key: str  # "br:4:22" (coding:level:extra), also the --rss argument
    coding: str
    label: str
    make: Callable[[], enc.Encoder]


def _coders() -> list[Coder]:
    coders: list[Coder] = []

    def br(q: int, lgwin: int = 22) -> None:
        label = f"q{q}" + ("" if lgwin == 22 else f" lgwin {lgwin}")
        coders.append(Coder(f"br:{q}:{lgwin}", "br", label, lambda: enc.BrotliEncoder(q, lgwin)))

    def zstd(level: int, small: bool = False) -> None:
        params = levels.ZSTD_STREAM_PARAMS if small else {}
        pool = enc.ZstdCompressorPool(level, **params)
        label = f"{level}" + (" small" if small else "")
        key = f"zstd:{level}:{int(small)}"
        coders.append(Coder(key, "zstd", label, lambda: enc.ZstdEncoder(pool)))

    def gzip(level: int) -> None:
        coders.append(Coder(f"gzip:{level}:0", "gzip", f"{level}", lambda: enc.GzipEncoder(level)))

    for q in (1, 3, 4, 5, 6, 11):
        br(q)
    br(3, 16)
    br(5, 16)
    for level in (1, 3, 6, 19):
        zstd(level)
    zstd(3, small=True)
    for level in (1, 4, 6, 9):
        gzip(level)
    return coders


def _defaults(stream: bool) -> set[str]:
    if stream:
        return {
            f"br:{levels.BR_STREAM_QUALITY}:{levels.BR_STREAM_LGWIN}",
            f"zstd:{levels.ZSTD_STREAM_LEVEL}:1",
            f"gzip:{levels.GZIP_STREAM_LEVEL}:0",
        }
    return {
        f"br:{levels.BR_QUALITY}:{levels.BR_LGWIN}",
        f"zstd:{levels.ZSTD_LEVEL}:0",
        f"gzip:{levels.GZIP_LEVEL}:0",
    }


# ---------------------------------------------------------------- shapes


def _json_body(path: str, request: dict[str, object]) -> bytes:
    reply = engine.reply("POST", path, orjson.dumps(request))
    assert reply.status == 200 and reply.body is not None, reply
    return reply.body


def _sse_events() -> list[bytes]:
    request = {
        "model": "mock-gpt-4o",
        "messages": [{"role": "user", "content": "Tell me about gateways."}],
        "max_tokens": 200,
        "stream": True,
    }
    reply = engine.reply("POST", "/chat/completions", orjson.dumps(request))
    assert reply.events is not None

    async def collect() -> list[bytes]:
        assert reply.events is not None
        return [event async for event in reply.events]

    return asyncio.run(collect())


def _shapes() -> dict[str, list[bytes]]:
    embed = {"model": "mock-embedding-3-small", "input": "The quick brown fox."}
    chat = {
        "model": "mock-gpt-4o",
        "messages": [{"role": "user", "content": "Tell me about gateways."}],
        "max_tokens": 200,
    }
    return {
        "embeddings": [_json_body("/embeddings", {**embed, "encoding_format": "float"})],
        "embeddings-b64": [_json_body("/embeddings", {**embed, "encoding_format": "base64"})],
        "chat": [_json_body("/chat/completions", chat)],
        "sse": _sse_events(),
    }


# ---------------------------------------------------------------- measuring


def _encode(make: Callable[[], enc.Encoder], parts: list[bytes], stream: bool) -> int:
    e = make()
    size = 0
    if stream:
        for part in parts:
            size += len(e.encode(part)) + len(e.flush())
    else:
        for part in parts:
            size += len(e.encode(part))
    return size + len(e.finish())


def _cpu_us(coder: Coder, parts: list[bytes], stream: bool, budget: float) -> float:
    _encode(coder.make, parts, stream)  # warm-up (pools, caches, lazy tables)
    samples: list[float] = []
    deadline = time.perf_counter() + budget
    gc.disable()
    try:
        while len(samples) < MAX_ITERATIONS and (
            len(samples) < MIN_ITERATIONS or time.perf_counter() < deadline
        ):
            t0 = time.process_time()
            _encode(coder.make, parts, stream)
            samples.append(time.process_time() - t0)
    finally:
        gc.enable()
    return statistics.median(samples) * 1e6


def _rss_child(key: str) -> None:
    """Child mode: resident KiB per live stream encoder (they each sent one event)."""
    coder = next(c for c in _coders() if c.key == key)
    event = _sse_events()[1]

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    gc.collect()
    before = rss()
    live = []
    for _ in range(RSS_ENCODERS):
        e = coder.make()
        e.encode(event)
        e.flush()
        live.append(e)
    print((rss() - before) / RSS_ENCODERS / 1024)


def _rss_kib(key: str) -> float | None:
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--rss", key],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return float(out.stdout.strip())
    except (subprocess.SubprocessError, ValueError, OSError):
        return None


@dataclass
class Row:
    shape: str
    coder: Coder
    size: int
    raw: int
    cpu_us: float
    rss_kib: float | None
    default: bool


def run(budget: float, shapes: list[str], rss: bool) -> list[Row]:
    coders = _coders()
    rows: list[Row] = []
    for shape, parts in _shapes().items():
        if shape not in shapes:
            continue
        stream = shape == "sse"
        raw = sum(map(len, parts))
        defaults = _defaults(stream)
        for coder in coders:
            size = _encode(coder.make, parts, stream)
            cpu = _cpu_us(coder, parts, stream, budget)
            kib = _rss_kib(coder.key) if stream and rss else None
            rows.append(Row(shape, coder, size, raw, cpu, kib, coder.key in defaults))
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'shape':<15}{'coding':<7}{'level':<14}{'bytes':>8}{'saved':>8}"
        f"{'CPU µs':>10}{'KiB/stream':>12}"
    )
    shape = None
    for row in rows:
        if row.shape != shape:
            shape = row.shape
            print()
            print(f"{shape}: {row.raw} bytes identity")
            print(header)
            print("-" * len(header))
        saved = 100 * (1 - row.size / row.raw)
        kib = "" if row.rss_kib is None else f"{row.rss_kib:.0f}"
        mark = "*" if row.default else " "
        print(
            f"{row.shape:<15}{row.coder.coding:<7}{mark + row.coder.label:<14}{row.size:>8}"
            f"{saved:>7.1f}%{row.cpu_us:>10.1f}{kib:>12}"
        )


#: levels too slow to be a default whatever they save (100x+ the CPU of the ordinary ones)
EXTREME = {"br:11:22", "zstd:19:0"}

REASONS = """\
Why (the rule: the cheapest level within about a point of the best ordinary level, i.e. not br 11
or zstd 19; for streams, memory per live encoder breaks ties; details in
gateway/encoding/levels.py):
  bodies   br    q3 (64 KiB window) is within 0.2 points of the best on both embeddings bodies
                 at the lowest CPU; on chat q5 saves ~4 points (~60 bytes) more, but both fit in
                 one TCP segment: not worth ~1.8x the CPU. lgwin 16 allocates ~3x less than 22.
           zstd  3 is within a point of 6 at a third of its CPU; 1 loses ~4 points on chat.
           gzip  4 has the bytes of 6-9 at under half of 6's CPU on float embeddings.
  streams  br    q3 is within a point of q4-q6 at ~2/3 of their CPU and ~270 KiB per stream.
           zstd  3 with small tables: the bytes of stock 3 at a tenth of its memory per stream.
           gzip  1 is within a point of 9 at the lowest CPU; memory is the same at every level.
Non-stream bodies under {minb} bytes stay identity (MIN_COMPRESS_BYTES).
"""


def print_defaults(rows: list[Row]) -> None:
    """The defaults' own rows, with the gap to the best ordinary level of the same coding."""
    print("Defaults: saved % (points behind the best ordinary level of that coding), CPU µs")
    shapes = list(dict.fromkeys(row.shape for row in rows))
    for row in rows:
        if not row.default:
            continue
        peers = [
            r
            for r in rows
            if r.shape == row.shape
            and r.coder.coding == row.coder.coding
            and r.coder.key not in EXTREME
        ]
        best = min(r.size for r in peers)
        behind = 100 * (row.size - best) / row.raw
        kib = "" if row.rss_kib is None else f", {row.rss_kib:.0f} KiB/stream"
        profile = "stream" if row.shape == "sse" else "body"
        print(
            f"  {profile:<7}{row.shape:<15}{row.coder.coding:<5}{row.coder.label:<12}"
            f"{100 * (1 - row.size / row.raw):5.1f}% ({behind:.1f} behind), "
            f"{row.cpu_us:.0f} µs{kib}"
        )
    if len(shapes) < len(SHAPES):
        print("  (a subset of the shapes was measured)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per row (default 0.3)")
    parser.add_argument("--no-rss", action="store_true", help="skip the per-stream memory column")
    parser.add_argument(
        "--shape", action="append", choices=SHAPES, help="only these shapes (repeatable)"
    )
    parser.add_argument("--rss", metavar="KEY", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss:
        _rss_child(args.rss)
        return 0
    print(
        f"python {sys.version.split()[0]}, brotli {brotli.__version__}, "
        f"zstandard {zstandard.__version__}, zlib {zlib.ZLIB_RUNTIME_VERSION}"
    )
    shapes = args.shape or list(SHAPES)
    rows = run(args.budget, shapes, rss=not args.no_rss and sys.platform == "linux")
    print_table(rows)
    print()
    print_defaults(rows)
    print()
    print(REASONS.format(minb=enc.MIN_COMPRESS_BYTES), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
