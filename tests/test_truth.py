"""The Timeline's points sit at the sockets (docs/spec.md §6): what the gateway reports is
what a client sees, split honestly between the upstream's time and the gateway's.

Real sockets throughout: the gateway runs on ``gateway.server``'s own server (the
protocol that stamps ``received``), the upstream is a scripted server, the client a raw socket.
Nothing here asserts a speed: the known delays (200 ms upstream, 300 ms client pause) are far
above anything a loaded machine adds, and the checks are orderings and sums.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from gateway.config import Config
from gateway.context import RECEIVED_AT, RequestContext, Timeline
from tests.support import (
    LAST_CHUNK,
    GatewayServer,
    ScriptedUpstream,
    SeenRequest,
    chat_chunk,
    chunk,
    config_for,
    http_response,
    running,
    sse_head,
)

UPSTREAM_DELAY_S = 0.2
CLIENT_PAUSE_S = 0.3
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-truth",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'
STREAM_BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}'
QUIET = '[logging]\naccess_log = "all"\n[cache]\nbackend = "off"\n[tracing]\nexporter = "none"\n'


def _head(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()


def _read_all(sock: socket.socket) -> bytes:
    parts = []
    while data := sock.recv(65536):
        parts.append(data)
    return b"".join(parts)


def _server_timing(raw: bytes) -> dict[str, float]:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    m = re.search(r"(?im)^server-timing: (.*)$", head)
    assert m, head
    return {k: float(v) for k, v in re.findall(r"(\w+);dur=([0-9.]+)", m.group(1))}


def _wait_lines(lines: list[dict[str, Any]], n: int = 1) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while len(lines) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(lines) >= n, "no access log line"
    return lines[n - 1]


# ---------------------------------------------------------------- the Timeline


def test_received_comes_from_the_scope_stamp_and_moves_the_wall_clock() -> None:
    earlier = time.perf_counter() - 0.25
    timeline = Timeline()
    wall_before = timeline.wall_ns
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", RECEIVED_AT: earlier}
    ctx = RequestContext(scope, timeline)
    assert ctx.timeline.received == earlier
    # the wall clock is moved back with it: span timestamps stay on the socket read
    assert wall_before - timeline.wall_ns == pytest.approx(0.25e9, rel=0.2)


def test_without_a_stamp_received_is_the_first_asgi_event() -> None:
    before = time.perf_counter()
    ctx = RequestContext({"type": "http", "method": "GET", "path": "/"}, Timeline())
    assert ctx.timeline.received >= before


# ---------------------------------------------------------------- over real sockets


def _slow_answer(delay: float) -> Callable[[SeenRequest, asyncio.StreamWriter], Any]:
    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(delay)
        writer.write(http_response(200, ANSWER))
        return True

    return handler


def test_upstream_time_is_the_upstreams_and_the_rest_is_overhead(
    gateway: Callable[[Config], GatewayServer], access_lines: list[dict[str, Any]]
) -> None:
    up = ScriptedUpstream(_slow_answer(UPSTREAM_DELAY_S))
    with running(up):
        gw = gateway(config_for(up.url, QUIET))
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            t0 = time.perf_counter()
            sock.sendall(_head("/v1/chat/completions", BODY) + BODY)
            raw = _read_all(sock)
            seen_ms = (time.perf_counter() - t0) * 1000
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    st = _server_timing(raw)
    log = _wait_lines(access_lines)
    upstream, overhead, request = (
        log["upstream_time_ms"],
        log["overhead_ms"],
        log["request_time_ms"],
    )
    # the upstream's 200 ms are booked as upstream time, not as the gateway's
    assert upstream >= UPSTREAM_DELAY_S * 1000
    assert st["upstream"] >= UPSTREAM_DELAY_S * 1000
    assert overhead < upstream / 2
    assert st["gateway"] < st["upstream"] / 2
    # one timeline: the parts add up, and the whole is no more than the client saw
    assert request == pytest.approx(upstream + overhead, abs=0.002)
    assert request <= seen_ms
    assert st["upstream"] <= upstream + 0.002


def test_received_is_the_first_byte_not_the_first_asgi_event(
    gateway: Callable[[Config], GatewayServer], access_lines: list[dict[str, Any]]
) -> None:
    """The client sends its request line, pauses, then the rest: the app sees nothing until
    the head is complete, but the request began at its first byte (as nginx counts it)."""
    up = ScriptedUpstream(_slow_answer(0))
    with running(up):
        gw = gateway(config_for(up.url, QUIET))
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = _head("/v1/chat/completions", BODY)
            first_line_end = head.index(b"\r\n") + 2
            t0 = time.perf_counter()
            sock.sendall(head[:first_line_end])
            time.sleep(CLIENT_PAUSE_S)
            sock.sendall(head[first_line_end:] + BODY)
            raw = _read_all(sock)
            seen_ms = (time.perf_counter() - t0) * 1000
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    log = _wait_lines(access_lines)
    # counted from the first byte, the pause is inside the request (from the first ASGI event it
    # would be a few ms); the first read's callback may itself run a little late on a loaded
    # machine (the loop lag), so half the pause is the bound, far above the few ms
    assert log["request_time_ms"] >= CLIENT_PAUSE_S * 1000 / 2
    assert log["request_time_ms"] <= seen_ms
    # the client's pause is not the upstream's: it is on the gateway's side of the ledger
    assert log["upstream_time_ms"] < CLIENT_PAUSE_S * 1000
    assert _server_timing(raw)["gateway"] >= CLIENT_PAUSE_S * 1000 / 2


def _slow_first_token(delay: float) -> Callable[[SeenRequest, asyncio.StreamWriter], Any]:
    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        await writer.drain()
        await asyncio.sleep(delay)
        writer.write(chunk(chat_chunk("Hello")))
        writer.write(chunk(chat_chunk(None, finish="stop")) + chunk(b"data: [DONE]\n\n"))
        writer.write(LAST_CHUNK)
        return True

    return handler


def test_reported_ttft_is_at_most_what_the_client_saw(
    gateway: Callable[[Config], GatewayServer], access_lines: list[dict[str, Any]]
) -> None:
    up = ScriptedUpstream(_slow_first_token(UPSTREAM_DELAY_S))
    with running(up):
        gw = gateway(config_for(up.url, QUIET))
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            t0 = time.perf_counter()
            sock.sendall(_head("/v1/chat/completions", STREAM_BODY) + STREAM_BODY)
            got = b""
            while b'"Hello"' not in got:
                data = sock.recv(65536)
                assert data, got
                got += data
            client_ttft_ms = (time.perf_counter() - t0) * 1000
            _read_all(sock)
    log = _wait_lines(access_lines)
    assert log["ttft_ms"] is not None
    assert UPSTREAM_DELAY_S * 1000 <= log["ttft_ms"] <= client_ttft_ms
    assert log["request_time_ms"] == pytest.approx(
        log["upstream_time_ms"] + log["overhead_ms"], abs=0.002
    )
