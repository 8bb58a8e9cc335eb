"""The compression levels the gateway encodes with, and the limits its codecs hold to."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

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
#: compressors and decompressors kept per pool for the next response (a burst beyond it builds
#: new ones and lets them go)
_POOL_MAX: Final = 32
