"""The gateway's HTTP/1.1 client (gateway/transports/http1_client.py) driven directly against
scripted upstreams on real sockets: framing, keep-alive pooling, the pool bound, flow control,
timeouts, socket timestamps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import BackendConfig
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports.http1_client import Http1ClientTransport
from tests.support import (
    LAST_CHUNK,
    ScriptedUpstream,
    SeenRequest,
    answering,
    chunk,
    free_port,
    http_response,
    sse_head,
    until,
)


def transport(url: str, **cfg: Any) -> Http1ClientTransport:
    return Http1ClientTransport(BackendConfig(name="b", url=url, **cfg))


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


def test_complete_body_takes_a_whole_answer_at_once_and_only_then(scripted):
    """The relay's fast path: an answer read whole is taken in one call (and the connection
    goes back to the pool); one still arriving, or bigger than the limit, is left to aiter_raw."""

    async def late_body(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"late")
        return True

    whole = scripted(answering(b'{"ok": true}'))
    late = scripted(late_body)
    t, t_late = transport(whole.url), transport(late.url)

    async def main() -> None:
        for _ in range(3):
            resp = await t.request("POST", whole.url + "/x", [], b"{}")
            await asyncio.sleep(0.01)  # the body is read by then
            assert resp.complete_body(5) is None  # over the limit: nothing taken
            assert resp.complete_body(1024) == b'{"ok": true}'
            assert await body_of(resp) == b""  # taken: nothing left to iterate
        resp = await t_late.request("GET", late.url + "/x", [], None)
        assert resp.complete_body(1024) is None  # the head came alone
        assert await body_of(resp) == b"late"
        await t.aclose()
        await t_late.aclose()

    run(main)
    assert whole.connections == 1 and len(whole.requests) == 3


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


# ---------------------------------------------------------------- the pool's sockets


def test_a_connection_released_after_the_pool_closed_is_closed_not_only_counted_out(scripted):
    up = scripted(answering(b'{"ok": true}'))
    t = transport(up.url)

    async def main() -> None:
        resp = await t.request("GET", up.url + "/models", [], None)
        assert b"".join([c async for c in resp.aiter_raw()]) == b'{"ok": true}'
        await t.aclose()  # shutdown while the answer is still held
        await resp.aclose()  # complete and keep-alive: it would have gone back to the pool
        await until(lambda: up.closed_connections == 1, "the upstream sees the socket close")
        assert t.open_connections == 0

    run(main)
    assert up.connections == 1


def test_an_idle_connection_is_closed_after_idle_timeout(scripted):
    up = scripted(answering(b"{}"))
    t = transport(up.url, idle_timeout_s=0.1)

    async def main() -> None:
        assert await body_of(await t.request("GET", up.url + "/models", [], None)) == b"{}"
        # no request comes: the pool itself closes the idle socket (nginx keepalive_timeout)
        await until(lambda: up.closed_connections == 1, "the idle connection is closed")
        assert t.open_connections == 0
        assert await body_of(await t.request("GET", up.url + "/models", [], None)) == b"{}"
        await t.aclose()

    run(main)
    assert up.connections == 2


def test_an_idle_connection_within_idle_timeout_is_reused(scripted):
    up = scripted(answering(b"{}"))
    t = transport(up.url, idle_timeout_s=30)

    async def main() -> None:
        for _ in range(3):
            assert await body_of(await t.request("GET", up.url + "/models", [], None)) == b"{}"
            await asyncio.sleep(0.05)
        assert t.open_connections == 1
        await t.aclose()
        await until(lambda: up.closed_connections == 1, "aclose closes the idle connection")
        assert t.open_connections == 0

    run(main)
    assert up.connections == 1


def test_a_connection_the_upstream_closed_unannounced_is_not_reused_before_the_loop_saw_it(
    scripted,
):
    """An upstream that closes right after a complete answer without ``Connection: close``:
    its FIN is in the socket before the loop has read it (the thread blocks, as a busy loop
    would), and the next request at once must not be written into that connection."""

    async def answer_and_close(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(http_response(200, b"{}"))
        await writer.drain()
        return False

    up = scripted(answer_and_close)
    t = transport(up.url)

    async def main() -> None:
        for _ in range(3):
            assert await body_of(await t.request("GET", up.url + "/models", [], None)) == b"{}"
            deadline = time.monotonic() + 5
            while up.closed_connections < up.connections and time.monotonic() < deadline:
                time.sleep(0.01)  # noqa: ASYNC251 - the FIN arrives; the loop must not turn
        await t.aclose()

    run(main)
    assert up.connections == 3 and len(up.requests) == 3


def test_every_reuse_is_checked_however_long_the_connection_was_idle(scripted, monkeypatch):
    """A FIN can arrive after the loop's last poll whatever the connection's idle time: each
    reuse asks poll(2) (an earlier shortcut skipped connections idle past one loop turn, and a
    loaded machine wrote requests into closed connections)."""
    from gateway.transports import http1_client_connection

    checks: list[int] = []
    real = http1_client_connection.UpstreamConnection.peer_closed

    def counted(self: Any) -> bool:
        checks.append(1)
        return real(self)

    monkeypatch.setattr(http1_client_connection.UpstreamConnection, "peer_closed", counted)
    up = scripted(answering(b"{}"))
    t = transport(up.url)

    async def main() -> None:
        assert await body_of(await t.request("GET", up.url + "/m", [], None)) == b"{}"
        assert checks == []  # a new connection is not checked
        assert await body_of(await t.request("GET", up.url + "/m", [], None)) == b"{}"
        assert len(checks) == 1  # reused at once
        await asyncio.sleep(0)  # turns of the loop (its I/O polls) between release and reuse
        await asyncio.sleep(0)
        assert await body_of(await t.request("GET", up.url + "/m", [], None)) == b"{}"
        assert len(checks) == 2
        await t.aclose()

    run(main)
    assert up.connections == 1


def test_aclose_closes_connections_still_in_use(scripted):
    async def endless(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head() + chunk(b"data: {}\n\n"))
        for _ in range(500):  # never ends by itself; a write fails once the gateway closed
            await asyncio.sleep(0.02)
            writer.write(chunk(b": ping\n\n"))
            await writer.drain()
        return False

    up = scripted(endless)
    t = transport(up.url)

    async def main() -> None:
        resp = await t.request("POST", up.url + "/x", [], b"{}")
        body = resp.aiter_raw()
        assert await body.__anext__() == b"data: {}\n\n"
        await t.aclose()  # the runtime's shutdown, with a stream left over after the grace
        await until(lambda: up.closed_connections == 1, "aclose closes the stream's socket")
        with pytest.raises(UpstreamError):  # after what arrived before the close
            async for _ in body:
                pass
        await resp.aclose()
        assert t.open_connections == 0

    run(main)


def test_failed_connects_free_their_place_in_the_pool():
    t = transport(f"http://127.0.0.1:{free_port()}/v1", max_connections=1)

    async def main() -> None:
        for _ in range(3):  # never a pool timeout: each failure gave its place back
            with pytest.raises(UpstreamConnectError):
                await t.request("GET", "http://x/v1/models", [], None)
        assert t.open_connections == 0
        await t.aclose()

    run(main)


# ---------------------------------------------------------------- the read timeout


def test_the_read_timeout_cuts_a_body_wait_not_a_stream_that_keeps_coming(scripted):
    async def steady_then_stall(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        for i in range(6):  # 0.6 s in all, more than the read timeout, gaps well under it
            writer.write(chunk(b"data: %d\n\n" % i))
            await writer.drain()
            await asyncio.sleep(0.1)
        if req.target.endswith("/stall"):
            await asyncio.sleep(5)
        writer.write(LAST_CHUNK)
        return True

    up = scripted(steady_then_stall)
    t = transport(up.url, read_timeout_s=0.4)

    async def main() -> None:
        resp = await t.request("POST", up.url + "/ends", [], b"{}")
        assert (await body_of(resp)).count(b"data: ") == 6
        resp = await t.request("POST", up.url + "/stall", [], b"{}")
        got: list[bytes] = []
        with pytest.raises(UpstreamTimeout) as info:
            async for part in resp.aiter_raw():
                got.append(part)
        await resp.aclose()
        assert info.value.code == "upstream_read_timeout"
        assert b"".join(got).count(b"data: ") == 6
        assert t.open_connections == 0  # a timed-out connection is never reused
        await t.aclose()

    run(main)


def test_a_kept_alive_connection_times_each_wait_from_its_own_start(scripted):
    """The read timeout is one timer per connection, kept across requests: set for an earlier
    wait, it must neither cut a later wait short nor let one last for ever."""

    async def later(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        if req.target.endswith("/late"):
            await asyncio.sleep(0.5)
        if req.target.endswith("/never"):
            await asyncio.sleep(5)
        writer.write(http_response(200, b"{}"))
        return True

    up = scripted(later)
    t = transport(up.url, read_timeout_s=1.0)

    async def main() -> None:
        assert await body_of(await t.request("GET", up.url + "/now", [], None)) == b"{}"
        await asyncio.sleep(0.7)  # the timer set for the first wait fires during the next one
        assert await body_of(await t.request("GET", up.url + "/late", [], None)) == b"{}"
        with pytest.raises(UpstreamTimeout):
            await t.request("GET", up.url + "/never", [], None)
        await t.aclose()

    run(main)
    assert up.connections == 1


class _WriteWakesTheUpstream:
    """A socket transport whose write takes a while, as when the write syscall wakes an
    upstream on the same host and the scheduler runs its whole handler before the writer
    resumes: the time of that write is the upstream's, not the gateway's."""

    def __init__(self, inner: Any, takes_s: float) -> None:
        self._inner = inner
        self._takes_s = takes_s
        self.write_began: list[float] = []

    def write(self, data: bytes) -> None:
        self.write_began.append(time.perf_counter())
        self._inner.write(data)
        time.sleep(self._takes_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("streamed", [False, True], ids=["bytes", "chunked"])
def test_sent_at_is_stamped_before_the_last_write_not_after_it(scripted, streamed: bool):
    up = scripted(answering(b"{}"))
    t = transport(up.url)
    takes_s = 0.05

    async def chunks():
        yield b"{"
        yield b"}"

    async def main() -> None:
        assert await body_of(await t.request("GET", up.url + "/models", [], None)) == b"{}"
        (conn,) = t._idle
        slow = conn.transport = _WriteWakesTheUpstream(conn.transport, takes_s)
        resp = await t.request("POST", up.url + "/x", [], chunks() if streamed else b"{}")
        assert await body_of(resp) == b"{}"
        last_write = slow.write_began[-1]
        # the write's time is inside the attempt's window: booked as the upstream's
        assert resp.started_at == resp.sent_at <= last_write
        assert resp.first_byte_at is not None
        assert resp.first_byte_at - resp.sent_at >= takes_s
        await t.aclose()

    run(main)
    assert up.connections == 1
