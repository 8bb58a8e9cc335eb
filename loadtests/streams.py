#!/usr/bin/env python3
"""A paced SSE upstream and a stream client, for the stream rows of ``overhead.py``.

    python loadtests/streams.py upstream --port 9000 [--rate 100]
    python loadtests/streams.py client --url http://127.0.0.1:9000 --streams 100 \\
        --concurrency 100 --events 500

``upstream`` answers every ``POST`` with a chat completion stream (chunked ``text/event-stream``):
the head and the first content event at once, then ``max_tokens`` (from the request body)
content events in all, each at ``start + i / rate`` (no drift: the pace is the upstream's, not
the event loop's), then a ``finish_reason`` chunk and ``data: [DONE]``. Keep-alive, one timer
per event, no parsing beyond what that needs.

``client`` runs ``--streams`` streams, ``--concurrency`` at a time (each worker on its own
keep-alive connection), and prints one JSON line: time to first token (request written → first
content event read), the gaps between consecutive events of a stream as read, and errors. Each
read is stamped once; every event in it gets that time.

Both use uvloop when it is installed and stop by themselves (``upstream`` on SIGTERM/SIGINT).
All traffic is to the address given (``overhead.py`` uses 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

EVENT = (
    b'data: {"id":"chatcmpl-stream","object":"chat.completion.chunk","created":1733140800,'
    b'"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"tok "},'
    b'"finish_reason":null}]}\n\n'
)
FINISH = (
    b'data: {"id":"chatcmpl-stream","object":"chat.completion.chunk","created":1733140800,'
    b'"model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


EVENT_CHUNK = _chunk(EVENT)
END = _chunk(FINISH) + b"0\r\n\r\n"


# ---------------------------------------------------------------- upstream


class _Upstream(asyncio.Protocol):
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.loop = asyncio.get_running_loop()
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next_request()

    def _next_request(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").lower()
        length = 0
        for line in head.split("\r\n"):
            if line.startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        try:
            events = int(json.loads(body).get("max_tokens") or 10)
        except (ValueError, AttributeError):
            events = 10
        self.busy = True
        assert self.transport is not None
        self.transport.write(HEAD + EVENT_CHUNK)
        self._schedule(self.loop.time(), 1, max(1, events))

    def _schedule(self, start: float, i: int, events: int) -> None:
        if i >= events:
            self.loop.call_at(start + i / self.rate, self._end)
        else:
            self.loop.call_at(start + i / self.rate, self._send, start, i, events)

    def _send(self, start: float, i: int, events: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(EVENT_CHUNK)
        self._schedule(start, i + 1, events)

    def _end(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(END)
        self.busy = False
        self._next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve_upstream(port: int, rate: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Upstream(rate), "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"streams upstream on 127.0.0.1:{port}, {rate:g} events/s", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()


# ---------------------------------------------------------------- client


class _Stream(asyncio.Protocol):
    """One keep-alive connection; one stream at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.sent_at = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.head_seen = False
        self.tail = b""
        self.status = b""
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.first = self.last = None
        self.gaps = []
        self.head_seen = False
        self.tail = b""
        self.sent_at = time.perf_counter()
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.head_seen:
            self.status = data[:12]
            self.head_seen = True
        n = data.count(b"data: {")
        if n:
            if self.first is None:
                self.first = now
            elif self.last is not None:
                self.gaps.append(now - self.last)
            self.gaps.extend([0.0] * (n - 1))
            self.last = now
        self.tail = (self.tail + data)[-16:]
        if self.tail.endswith(b"\r\n0\r\n\r\n") and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost mid-stream"))


def _request(host: str, port: int, events: int) -> bytes:
    body = json.dumps(
        {
            "model": "gpt-4o-mini",
            "stream": True,
            "max_tokens": events,
            "messages": [{"role": "user", "content": "stream, please"}],
        }
    ).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\nauthorization: Bearer sk-bench\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def run_client(url: str, streams: int, concurrency: int, events: int) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _request(host, port, events)
    loop = asyncio.get_running_loop()
    ttft: list[float] = []
    gaps: list[float] = []
    errors: list[str] = []
    left = [streams]

    async def worker() -> None:
        proto: _Stream | None = None
        while left[0] > 0:
            left[0] -= 1
            if proto is None or proto.lost:
                _, proto = await loop.create_connection(_Stream, host, port)
            try:
                await asyncio.wait_for(proto.start(request), timeout=60 + events / 10)
            except (ConnectionError, TimeoutError) as exc:
                errors.append(type(exc).__name__)
                proto = None
                continue
            if not proto.status.startswith(b"HTTP/1.1 200") or proto.first is None:
                errors.append(proto.status.decode("latin-1", "replace") or "no answer")
                continue
            ttft.append(proto.first - proto.sent_at)
            gaps.extend(proto.gaps)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, streams)))))
    return {
        "streams": streams,
        "concurrency": concurrency,
        "events": events,
        "seconds": round(time.perf_counter() - t0, 3),
        "ttft_ms": _percentiles(ttft),
        "gap_ms": _percentiles(gaps),
        "gap_count": len(gaps),
        "errors": len(errors),
        "error_kinds": sorted(set(errors))[:5],
    }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 4)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99)}


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upstream", help="a paced SSE upstream")
    up.add_argument("--port", type=int, required=True)
    up.add_argument("--rate", type=float, default=100.0, help="events/s per stream [100]")
    cl = sub.add_parser("client", help="run streams, print one JSON line")
    cl.add_argument("--url", required=True)
    cl.add_argument("--streams", type=int, default=100)
    cl.add_argument("--concurrency", type=int, default=100)
    cl.add_argument("--events", type=int, default=500)
    args = p.parse_args(argv)
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        run = uvloop.run
    if args.cmd == "upstream":
        run(serve_upstream(args.port, args.rate))
        return 0
    result = run(run_client(args.url, args.streams, args.concurrency, args.events))
    print(json.dumps(result), flush=True)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
