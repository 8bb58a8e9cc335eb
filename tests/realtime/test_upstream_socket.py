"""The upstream socket (gateway/realtime/upstream_socket.py), over real connections: the direct path
(each message is offered to the relay in the read that completed it, and never ahead of one that
went to ``recv()`` before it and is not written yet), flow control, keepalive pings and the
handshake's failures."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.exceptions import InvalidHandshake, InvalidStatus

from gateway.realtime import upstream_socket
from gateway.realtime.upstream_socket import Closed, open_websocket
from tests.realtime.test_handshake import run


def test_messages_are_offered_as_read_but_never_ahead_of_one_queued_before(realtime_upstream):
    up = realtime_upstream()

    async def main() -> None:
        sock = await open_websocket(
            f"ws://127.0.0.1:{up.port}/v1/realtime?model=echo", [], [], 1 << 20, 10
        )
        assert '"session.created"' in str(await sock.recv())  # before any relay: recv()
        sock.relayed()
        taken: list[tuple[bytes, bool]] = []
        offered = asyncio.Event()
        accept = False

        def relay(data: bytes, text: bool, read_at: float) -> bool:
            assert read_at > 0
            if accept:
                taken.append((data, text))
                offered.set()
            return accept

        sock.attach(relay)
        await sock.send(b'{"type":"a"}', True)  # echoed; the relay declines it: recv() has it
        assert await sock.recv() == '{"type":"a"}'
        accept = True  # from now on the relay takes what it is offered, but "a" is not written
        await sock.send(b"b", False)
        assert await asyncio.wait_for(sock.recv(), 5) == b"b"  # behind "a", not to the relay
        assert taken == []
        sock.relayed()
        sock.relayed()  # both written: the next one is offered again
        await sock.send(b'{"type":"c"}', True)
        await asyncio.wait_for(offered.wait(), 10)
        assert taken == [(b'{"type":"c"}', True)]
        offered.clear()
        await sock.send(b"d", False)
        await asyncio.wait_for(offered.wait(), 10)
        assert taken[1] == (b"d", False)
        sock.attach(None)
        await sock.close(1000, "")

    run(main())


# ---------------------------------------------------------------- flow control and keepalive


def test_writes_wait_while_the_upstream_reads_nothing_then_resume(realtime_upstream):
    """An upstream that stops reading: the direct path's write declines once the socket's write
    buffer is over its high-water mark, ``send`` waits, and both go on once it reads again."""
    up = realtime_upstream()

    async def main() -> int:
        sock = await open_websocket(
            f"ws://127.0.0.1:{up.port}/v1/realtime?model=stall", [], [], None, 10
        )
        assert '"session.created"' in str(await sock.recv())
        chunk = b"x" * (1 << 16)
        written = 0
        while sock.write(chunk, False):
            written += 1
            assert written < 1000, "the writes never met back-pressure"
            await asyncio.sleep(0)  # let the transport flush what the kernel takes
        send = asyncio.ensure_future(sock.send(chunk, False))
        await asyncio.sleep(0.3)
        assert not send.done()  # send waits for the buffer to drain
        up.release()
        await asyncio.wait_for(send, 10)
        for _ in range(500):  # the buffer drains: the direct path writes again
            if sock.write(b"y", False):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the direct path never wrote again")
        await sock.close(1000, "")
        return written

    assert run(main(), timeout=30) > 0
    (seen,) = up.wait_ended(timeout=5)
    assert seen.received[-1] == b"y"


def test_an_unanswered_keepalive_ping_fails_the_connection_1011(realtime_upstream, monkeypatch):
    """No pong within PING_TIMEOUT_S: 1011 "keepalive ping timeout", and the connection is cut
    CLOSE_TIMEOUT_S later though the upstream never answers the close; pongs keep it open."""
    monkeypatch.setattr(upstream_socket, "PING_INTERVAL_S", 0.05)
    monkeypatch.setattr(upstream_socket, "PING_TIMEOUT_S", 0.2)
    up = realtime_upstream()

    async def main() -> None:
        alive = await open_websocket(
            f"ws://127.0.0.1:{up.port}/v1/realtime?model=echo", [], [], None, 10
        )
        stalled = await open_websocket(
            f"ws://127.0.0.1:{up.port}/v1/realtime?model=stall", [], [], None, 10
        )
        for sock in (alive, stalled):
            assert '"session.created"' in str(await sock.recv())
        started = time.perf_counter()
        with pytest.raises(Closed) as closed:
            await asyncio.wait_for(stalled.recv(), 5)
        assert (closed.value.code, closed.value.reason) == (1011, "keepalive ping timeout")
        assert time.perf_counter() - started < 0.25 + upstream_socket.CLOSE_TIMEOUT_S + 0.5
        await alive.send(b'{"type":"still-here"}', True)  # many pings later, pongs came
        assert await asyncio.wait_for(alive.recv(), 5) == '{"type":"still-here"}'
        await alive.close(1000, "")
        up.release()

    run(main())


# ---------------------------------------------------------------- the handshake


async def _answering(answer: bytes, *, close: bool = True) -> tuple[asyncio.Server, int]:
    """A TCP server that reads a request head and writes ``answer`` (then closes, if asked)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            if not close:
                await reader.read()  # until the client goes
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("answer", "status", "body"),
    [
        # a redirect is the handshake's failure, never followed
        (
            b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 0\r\n\r\n",
            302,
            b"",
        ),
        # a refusal whose body ends with the connection (no Content-Length)
        (
            b'HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\n\r\n{"error":{}}',
            503,
            b'{"error":{}}',
        ),
    ],
)
def test_an_http_answer_is_the_handshakes_failure_with_its_status_and_body(answer, status, body):
    async def main() -> InvalidStatus:
        server, port = await _answering(answer)
        async with server:
            with pytest.raises(InvalidStatus) as refused:
                await open_websocket(f"ws://127.0.0.1:{port}/v1/realtime", [], [], None, 5)
        return refused.value

    refused = run(main())
    assert refused.response.status_code == status
    assert bytes(refused.response.body or b"") == body


@pytest.mark.parametrize(
    "answer",
    [
        b"",  # closed without an answer
        b"not http\r\n\r\n",
        # 101 without the right Sec-WebSocket-Accept
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: wrong\r\n\r\n",
    ],
)
def test_an_invalid_answer_is_an_invalid_handshake(answer):
    async def main() -> None:
        server, port = await _answering(answer)
        async with server:
            with pytest.raises(InvalidHandshake):
                await open_websocket(f"ws://127.0.0.1:{port}/v1/realtime", [], [], None, 5)

    run(main())


def test_a_handshake_never_answered_times_out():
    async def main() -> None:
        server, port = await _answering(b"", close=False)
        async with server:
            started = time.perf_counter()
            with pytest.raises(TimeoutError):
                await open_websocket(f"ws://127.0.0.1:{port}/v1/realtime", [], [], None, 0.3)
            assert time.perf_counter() - started < 2

    run(main())
