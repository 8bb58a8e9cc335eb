"""The lean HTTP/1.1 client driven directly against scripted upstreams on real sockets:
framing, keep-alive pooling, the pool bound, flow control, timeouts, socket timestamps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import BackendConfig
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports.h1_impl import H1Transport
from tests.support import (
    LAST_CHUNK,
    ScriptedUpstream,
    SeenRequest,
    answering,
    chunk,
    free_port,
    http_response,
    sse_head,
)


def transport(url: str, **cfg: Any) -> H1Transport:
    return H1Transport(BackendConfig(name="b", url=url, **cfg))


async def body_of(resp: Any) -> bytes:
    try:
        return b"".join([c async for c in resp.aiter_raw()])
    finally:
        await resp.aclose()


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


@pytest.fixture
def scripted(upstream) -> Callable[..., ScriptedUpstream]:
    return upstream


def test_json_answer_keep_alive_and_one_connection_for_many_requests(scripted):
    up = scripted(answering(b'{"ok": true}'))
    t = transport(up.url)

    async def main() -> None:
        for _ in range(5):
            resp = await t.request("POST", up.url + "/chat/completions?x=1", [("a", "b")], b"{}")
            assert resp.status == 200 and (b"content-type", b"application/json") in resp.headers
            assert await body_of(resp) == b'{"ok": true}'
            assert resp.started_at <= resp.sent_at <= (resp.first_byte_at or 0)
            assert resp.done_at is not None and resp.done_at >= resp.first_byte_at
        await t.aclose()

    run(main)
    assert up.connections == 1 and len(up.requests) == 5
    seen = up.requests[0]
    assert seen.target == "/v1/chat/completions?x=1" and seen.body == b"{}"
    assert seen.header("host") == f"127.0.0.1:{up.port}" and seen.header("a") == "b"
    assert seen.header("content-length") == "2"


def test_a_body_that_is_not_read_closes_its_connection(scripted):
    up = scripted(answering(b"x" * 10_000))
    t = transport(up.url)

    async def main() -> None:
        resp = await t.request("GET", up.url + "/models", [], None)
        await resp.aclose()  # unread: never back to the pool
        resp = await t.request("GET", up.url + "/models", [], None)
        assert len(await body_of(resp)) == 10_000
        await t.aclose()

    run(main)
    assert up.connections == 2


def test_the_pool_is_bounded_and_waiters_get_the_released_connection(scripted):
    async def slow(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.1)
        writer.write(http_response(200, b"{}"))
        return True

    up = scripted(slow)
    t = transport(up.url, max_connections=2)

    async def one() -> bytes:
        return await body_of(await t.request("POST", up.url + "/x", [], b"{}"))

    async def main() -> None:
        assert await asyncio.gather(*(one() for _ in range(6))) == [b"{}"] * 6
        await t.aclose()

    run(main)
    assert up.connections == 2 and len(up.requests) == 6


def test_informational_responses_are_skipped_and_close_delimited_bodies_end_at_close(scripted):
    async def hints(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
        return False  # close: the body is delimited by it

    up = scripted(hints)
    t = transport(up.url)

    async def main() -> None:
        resp = await t.request("GET", up.url + "/x", [], None)
        assert resp.status == 200 and [k for k, _ in resp.headers] == [b"content-type"]
        assert await body_of(resp) == b"until the end"
        await t.aclose()

    run(main)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", "upstream_bad_framing"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
            "upstream_bad_framing",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "upstream_bad_framing",
        ),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\n", "upstream_bad_framing"),
        (b"NOT HTTP AT ALL\r\n\r\n", "upstream_bad_framing"),
        (b"", "upstream_disconnected"),
    ],
)
def test_broken_framing_is_an_upstream_error(scripted, raw: bytes, code: str):
    async def broken(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        return False

    up = scripted(broken)
    t = transport(up.url)

    async def main() -> None:
        with pytest.raises(UpstreamError) as info:
            await body_of(await t.request("GET", up.url + "/x", [], None))
        assert info.value.code == code, info.value
        await t.aclose()

    run(main)


def test_a_stream_arrives_chunk_by_chunk_and_a_slow_reader_pauses_the_upstream(scripted):
    big = b"data: " + b"x" * 100_000 + b"\n\n"

    async def stream(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        for _ in range(20):  # 2 MB, far more than the client's high-water mark
            writer.write(chunk(big))
            await writer.drain()
        writer.write(LAST_CHUNK)
        return True

    up = scripted(stream)
    t = transport(up.url)

    async def main() -> None:
        resp = await t.request("POST", up.url + "/x", [], b"{}")
        got = 0
        peak = 0
        async for part in resp.aiter_raw():
            got += len(part)
            peak = max(peak, resp._ex.unread)
            await asyncio.sleep(0.005)  # a slow client
        await resp.aclose()
        assert got == 20 * len(big)
        assert peak < 1_500_000  # bounded by flow control, not the whole 2 MB
        await t.aclose()

    run(main)


def test_timeouts_connect_refused_and_read(scripted):
    async def never(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    up = scripted(never)

    async def main() -> None:
        closed = transport(f"http://127.0.0.1:{free_port()}/v1")
        with pytest.raises(UpstreamConnectError):
            await closed.request("GET", f"http://127.0.0.1:{free_port()}/v1/x", [], None)
        slow = transport(up.url, read_timeout_s=0.2)
        start = time.monotonic()
        with pytest.raises(UpstreamTimeout) as info:
            await slow.request("POST", up.url + "/x", [], b"{}")
        assert info.value.code == "upstream_read_timeout" and time.monotonic() - start < 2
        await slow.aclose()

    run(main)


@pytest.mark.parametrize(
    ("target", "headers"),
    [("/x\r\nEvil: 1", []), ("/x", [("x-a", "v\r\nEvil: 1")]), ("/x", [("x-a\n", "v")])],
)
def test_cr_lf_never_reaches_the_upstream(scripted, target: str, headers: list[tuple[str, str]]):
    up = scripted(answering(b"{}"))
    t = transport(up.url)

    async def main() -> None:
        with pytest.raises(UpstreamError) as info:
            await t.request("GET", up.url + target, headers, None)
        assert info.value.code == "invalid_header"
        await t.aclose()

    run(main)
    assert up.requests == []


def test_a_streamed_request_body_goes_chunked(scripted):
    up = scripted(answering(b"{}"))
    t = transport(up.url)

    async def body():
        for part in (b"ab", b"", b"cd"):
            yield part

    async def main() -> None:
        assert await body_of(await t.request("POST", up.url + "/files", [], body())) == b"{}"
        await t.aclose()

    run(main)
    (seen,) = up.requests
    assert seen.body == b"abcd" and seen.header("transfer-encoding") == "chunked"
