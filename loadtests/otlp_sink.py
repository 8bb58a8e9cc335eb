#!/usr/bin/env python3
"""A fast, quiet OTLP/HTTP trace sink to run beside a benchmark.

    python loadtests/otlp_sink.py --port 4318 [--decode] [--status 200] [--delay 0] [--interval 0]

Serves ``POST /v1/traces`` (HTTP/1.1, keep-alive; Content-Length or chunked bodies) and answers
with an empty ``ExportTraceServiceResponse``. It counts export requests and body bytes as sent on
the wire (compressed, if the exporter compresses); with ``--decode`` it also decompresses
(gzip/deflate) and parses every body to count spans, which costs CPU in proportion to the span
rate. Without ``--decode`` bodies are counted and thrown away as they arrive.

One thread, one asyncio loop, no polling: idle, it uses no CPU. ``--status`` answers every export
with that status instead (a failing collector), ``--delay`` answers after that many seconds (a slow
one; reading from that connection pauses meanwhile).

On SIGTERM or SIGINT it prints the totals as one JSON line on stdout
(``{"requests": …, "bytes": …, "spans": …, "errors": …, "seconds": …, …}``; ``spans`` is null
without ``--decode``) and a readable summary on stderr, then exits 0. The address it listens on is
printed on stderr at start (``--port 0`` picks a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import signal
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field

TRACES_PATH = b"/v1/traces"
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Totals:
    requests: int = 0  # POST /v1/traces received
    bytes: int = 0  # their bodies, as sent (compressed if the exporter compressed)
    spans: int | None = None  # with --decode
    errors: int = 0  # anything else: wrong path or method, bad framing, undecodable body
    connections: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _response(status: int, body: bytes = b"", ctype: bytes = b"application/x-protobuf") -> bytes:
    reason = _REASONS.get(status, "Status").encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        reason,
        ctype,
        len(body),
        body,
    )


def count_spans(body: bytes, encoding: bytes) -> int:
    """Spans in an OTLP/protobuf ExportTraceServiceRequest body."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if encoding == b"gzip":
        body = gzip.decompress(body)
    elif encoding == b"deflate":
        body = zlib.decompress(body)
    elif encoding not in (b"", b"identity"):
        raise ValueError(f"unsupported Content-Encoding {encoding!r}")
    req = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


class SinkProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection: parse heads, count (or collect) bodies, answer."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiting = False  # a --delay answer is pending
        self._reset()

    def _reset(self) -> None:
        self.in_body = False
        self.remaining = 0  # Content-Length bytes still to come
        self.chunked = False
        self.parts: list[bytes] = []
        self.path = b""
        self.method = b""
        self.encoding = b""
        self.ctype = b""
        self.close_after = False
        self.body_len = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sink.totals.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            self._process()
        except _BadRequest:
            self.sink.totals.errors += 1
            self._write(_response(400), close=True)

    def _process(self) -> None:
        while self.transport is not None and not self.transport.is_closing():
            if self.waiting:
                return  # a delayed answer is pending; _late() resumes
            if not self.in_body:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > MAX_HEAD:
                        raise _BadRequest
                    return
                self._head(bytes(self.buf[:end]))
                del self.buf[: end + 4]
                continue
            if self.chunked:
                if not self._chunk():
                    return
                continue
            take = min(self.remaining, len(self.buf))
            if take:
                self.body_len += take
                if self.sink.decode:
                    self.parts.append(bytes(self.buf[:take]))
                del self.buf[:take]
                self.remaining -= take
            if self.remaining:
                return
            self._request_done()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        try:
            self.method, target, version = lines[0].split(b" ", 2)
        except ValueError:
            raise _BadRequest from None
        self.path = target.split(b"?", 1)[0]
        length = 0
        connection = b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise _BadRequest from None
            elif name == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif name == b"content-encoding":
                self.encoding = value.lower()
            elif name == b"content-type":
                self.ctype = value.split(b";", 1)[0].strip().lower()
            elif name == b"connection":
                connection = value.lower()
            elif name == b"expect" and value.lower() == b"100-continue":
                self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length < 0 or length > MAX_BODY:
            raise _BadRequest
        self.close_after = connection == b"close" or (
            version == b"HTTP/1.0" and connection != b"keep-alive"
        )
        self.remaining = length
        self.in_body = True
        if not self.chunked and not length:
            self._request_done()

    def _chunk(self) -> bool:
        """Consume one chunk (or the last one and its trailers); False if more bytes are needed."""
        eol = self.buf.find(b"\r\n")
        if eol < 0:
            return False
        try:
            size = int(bytes(self.buf[:eol]).split(b";", 1)[0], 16)
        except ValueError:
            raise _BadRequest from None
        if size == 0:
            end = self.buf.find(b"\r\n\r\n", eol)  # zero chunk, optional trailers, blank line
            if end < 0:
                return False
            del self.buf[: end + 4]
            self._request_done()
            return True
        if len(self.buf) < eol + 2 + size + 2:
            return False
        self.body_len += size
        if self.body_len > MAX_BODY:
            raise _BadRequest
        if self.sink.decode:
            self.parts.append(bytes(self.buf[eol + 2 : eol + 2 + size]))
        del self.buf[: eol + 2 + size + 2]
        return True

    def _request_done(self) -> None:
        totals = self.sink.totals
        size = self.body_len
        close = self.close_after
        if self.method != b"POST":
            totals.errors += 1
            answer = _response(405)
        elif self.path != TRACES_PATH:
            totals.errors += 1
            answer = _response(404)
        else:
            totals.requests += 1
            totals.bytes += size
            answer = (
                self.sink.answer_json if self.ctype == b"application/json" else self.sink.answer
            )
            if self.sink.decode and self.ctype != b"application/json":
                try:
                    totals.spans = (totals.spans or 0) + count_spans(
                        b"".join(self.parts), self.encoding
                    )
                except Exception:
                    totals.errors += 1
                    answer = _response(400)
            key = answer[9:12].decode()
            totals.by_status[key] = totals.by_status.get(key, 0) + 1
        self._reset()
        if self.sink.delay > 0 and self.transport is not None:
            self.waiting = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(self.sink.delay, self._late, answer, close)
        else:
            self._write(answer, close)

    def _late(self, answer: bytes, close: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.waiting = False
        self._write(answer, close)
        if self.transport.is_closing():
            return
        self.transport.resume_reading()
        self.data_received(b"")  # requests that arrived meanwhile

    def _write(self, data: bytes, close: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(data)
        if close:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.sink.protocols.discard(self)


class _BadRequest(Exception):
    pass


class Sink:
    def __init__(self, *, decode: bool, status: int, delay: float) -> None:
        self.decode = decode
        self.delay = delay
        self.totals = Totals(spans=0 if decode else None)
        self.protocols: set[SinkProtocol] = set()
        # an empty ExportTraceServiceResponse serializes to b"" (and to "{}" in OTLP/JSON)
        self.answer = _response(status)
        self.answer_json = _response(status, b"{}", b"application/json")

    def protocol(self) -> SinkProtocol:
        p = SinkProtocol(self)
        self.protocols.add(p)
        return p


async def serve(args: argparse.Namespace) -> Totals:
    loop = asyncio.get_running_loop()
    sink = Sink(decode=args.decode, status=args.status, delay=args.delay)
    server = await loop.create_server(sink.protocol, args.host, args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(
        f"otlp_sink listening on http://{args.host}:{port}/v1/traces", file=sys.stderr, flush=True
    )

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()

    async def report() -> None:
        last = (0, 0, 0)
        while True:
            await asyncio.sleep(args.interval)
            t = sink.totals
            now = (t.requests, t.bytes, t.spans or 0)
            rates = [(n - o) / args.interval for n, o in zip(now, last, strict=True)]
            last = now
            print(
                f"otlp_sink: {rates[0]:.1f} req/s {rates[1] / 1024:.1f} KiB/s"
                + (f" {rates[2]:.0f} spans/s" if args.decode else ""),
                file=sys.stderr,
                flush=True,
            )

    reporter = asyncio.create_task(report()) if args.interval > 0 else None
    try:
        await stop.wait()
    finally:
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        server.close()
        for p in list(sink.protocols):
            if p.transport is not None:
                p.transport.close()
        await server.wait_closed()
    sink.totals.seconds = round(time.monotonic() - started, 3)
    return sink.totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--port", type=int, default=4318, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--decode", action="store_true", help="parse bodies to count spans")
    parser.add_argument("--status", type=int, default=200, help="HTTP status to answer")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--interval", type=float, default=0.0, help="print rates every N s")
    args = parser.parse_args(argv)

    totals = asyncio.run(serve(args))
    print(json.dumps(asdict(totals)), flush=True)
    t = totals
    rate = t.requests / t.seconds if t.seconds else 0.0
    spans = f", {t.spans} spans" if t.spans is not None else ""
    print(
        f"otlp_sink: {t.requests} requests ({rate:.1f}/s), {t.bytes} bytes{spans}, "
        f"{t.errors} errors, {t.connections} connections in {t.seconds} s",
        file=sys.stderr,
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
