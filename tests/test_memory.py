"""Bounded memory and no leaks under many streams (SPEC §8, §13), measured on the gateway process
(`python -m gateway.cli serve`, VmRSS and /proc/<pid>/fd): a 1 GB stream relayed with flat
RSS, 1,000 concurrent streams all complete, 10,000 clients that leave mid-stream leave no
upstream connection, no attempt in flight and no file descriptor behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import urllib.request

import pytest

from tests.faults import FaultServer, FaultyUpstream, expected_text
from tests.gateway_process import (
    ask,
    backend_toml,
    chat_request,
    gateway_process,
    open_fds,
    raise_fd_limit,
    rss_kb,
    sse_content,
)
from tests.support import LAST_CHUNK, SeenRequest, chat_chunk, chunk, sse_head

ROUTE = '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\n'
GB = 1024**3
RSS_GROWTH_LIMIT_KB = 50 * 1024


@pytest.fixture(scope="module", autouse=True)
def fds() -> None:
    raise_fd_limit()


@pytest.fixture
def faults():
    upstream = FaultyUpstream()
    server = FaultServer(upstream.handler).start()
    server.seen = upstream.seen  # what each request asked for, as the upstream counted it
    yield server
    server.stop()


def readyz(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
        return json.loads(r.read())


def test_a_1gb_stream_is_relayed_with_rss_growth_under_50mb(tmp_path, faults):
    # temperature 0 with the memory cache: the cache tee sees the stream too (and must give up
    # at max_entry_bytes rather than hold it)
    config = backend_toml("up", faults.url) + ROUTE + '[cache]\nbackend = "memory"\n'
    with gateway_process(tmp_path, config) as gw:
        warm = asyncio.run(ask(gw.port, chat_request(gw.port, True, {"x-fault": "words=50"})))
        assert sse_content(warm.body) == (expected_text(50), True)
        pid = gw.proc.pid
        baseline = rss_kb(pid)
        peak = baseline
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.wait(0.05):
                peak = max(peak, rss_kb(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            received, tail = read_big_stream(gw.port)
        finally:
            stop.set()
            sampler.join(5)
        peak = max(peak, rss_kb(pid))
        assert received > GB  # every content byte plus the SSE and JSON framing
        assert tail.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # complete, then the last chunk
        growth = peak - baseline
        print(f"\n1 GB stream: gateway VmRSS {baseline} KiB -> peak {peak} KiB (+{growth} KiB)")
        assert growth < RSS_GROWTH_LIMIT_KB


def read_big_stream(port: int) -> tuple[int, bytes]:
    """Stream ``big=1 GiB`` through the gateway, counting body bytes; returns (count, tail)."""
    body = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "big"}]}'
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"x-fault: big={GB}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    buf = bytearray(1 << 20)
    total = 0
    tail = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        while True:
            n = sock.recv_into(buf)
            if not n:
                break
            total += n
            tail = (tail + bytes(buf[:n]))[-256:]
            if tail.endswith(b"0\r\n\r\n"):  # the chunked body's end
                break
    assert tail, "no answer"
    return total, tail


def test_1000_concurrent_streams_all_complete(tmp_path, faults):
    n = 1000
    config = backend_toml("up", faults.url, "max_connections = 1100") + ROUTE
    with gateway_process(tmp_path, config) as gw:
        request = chat_request(gw.port, True, {"x-fault": "drip=100,words=10"})  # ~1.2 s each

        async def all_streams() -> list[tuple[str, bool]]:
            answers = await asyncio.gather(*(ask(gw.port, request) for _ in range(n)))
            assert {a.status for a in answers} == {200}
            return [sse_content(a.body) for a in answers]

        results = asyncio.run(asyncio.wait_for(all_streams(), 60))
        assert results == [(expected_text(10), True)] * n
        assert faults.seen["drip"] == n
        assert all(b["outstanding"] == 0 for b in readyz(gw.port)["backends"].values())


async def endless_stream(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
    """One event, then one every 0.1 s for a minute: only a client that leaves ends it."""
    writer.write(sse_head() + chunk(chat_chunk("first")))
    for _ in range(600):
        await writer.drain()  # ConnectionResetError once the gateway has closed it
        await asyncio.sleep(0.1)
        writer.write(chunk(chat_chunk(".")))
    writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
    return True


async def leave_after_first_event(port: int, request: bytes) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await reader.readuntil(b"data: ")
        return True
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def test_10000_clients_leaving_mid_stream_leave_no_upstream_connection_and_no_fds(tmp_path):
    n, concurrency = 10_000, 100
    up = FaultServer(endless_stream).start()
    try:
        config = backend_toml("up", up.url) + ROUTE
        with gateway_process(tmp_path, config) as gw:
            pid = gw.proc.pid
            request = chat_request(gw.port, True)
            asyncio.run(ask_and_leave(gw.port, request, 50, 10))  # warm up (lazy imports, pools)
            settle(lambda: up.open_connections == 0)
            fds_before = open_fds(pid)

            asyncio.run(ask_and_leave(gw.port, request, n, concurrency))

            # each upstream request was cancelled and its connection closed (never pooled)
            settle(lambda: up.open_connections == 0)
            assert up.open_connections == 0
            assert len(up.requests) == n + 50
            settle(lambda: open_fds(pid) <= fds_before + 5)
            print(f"\n10,000 disconnects: gateway fds {fds_before} -> {open_fds(pid)}")
            assert open_fds(pid) <= fds_before + 5
            (state,) = readyz(gw.port)["backends"].values()
            assert state["outstanding"] == 0 and state["up"]  # a client leaving is no failure
    finally:
        up.stop()


async def ask_and_leave(port: int, request: bytes, n: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> bool:
        async with gate:
            return await leave_after_first_event(port, request)

    results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 120)
    assert all(results)


def settle(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
