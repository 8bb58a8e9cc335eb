"""Slow and too many clients (SPEC §4 [server]): slowloris heads are closed after
client_header_timeout_s while normal requests keep being answered; a stalled body gets a 408;
beyond max_client_connections new connections are refused while open ones keep working.
The gateway runs as `python -m gateway.cli serve` on the built-in mock backend."""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
import pytest

from tests.gateway_process import (
    Answer,
    ask,
    chat_request,
    gateway_process,
    open_fds,
    raise_fd_limit,
    read_answer,
)

MOCK = """
[[backends]]
name = "mock"
url = "mock://"

[[routes]]
models = ["*"]
backends = ["mock"]
"""
HEADER_TIMEOUT_S = 1.0
SLOWLORIS = 1000


@pytest.fixture(scope="module", autouse=True)
def fds() -> None:
    raise_fd_limit()


async def slowloris(port: int, byte_at_a_time: bool) -> tuple[float, bytes]:
    """Half a request head then silence, or a head one byte per 0.2 s; returns how long the
    connection stayed open and what the gateway sent before closing it."""
    head = chat_request(port, stream=False).split(b"\r\n\r\n")[0] + b"\r\n\r\n"
    opened = time.monotonic()  # before the connect: the gateway's clock starts after it
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def drip() -> None:
        if not byte_at_a_time:
            writer.write(head[: len(head) // 2])
            return
        for i in range(len(head) - 4):  # never the blank line that completes the head
            writer.write(head[i : i + 1])
            await asyncio.sleep(0.2)

    dripping = asyncio.ensure_future(drip())
    try:
        got = await asyncio.wait_for(reader.read(), 30)  # until the gateway closes it
    except ConnectionResetError:
        got = b""
    held = time.monotonic() - opened
    dripping.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await dripping
    writer.close()
    return held, got


def test_1000_slowloris_connections_are_closed_after_the_header_timeout(tmp_path):
    server = f"client_header_timeout_s = {HEADER_TIMEOUT_S}"
    with gateway_process(tmp_path, MOCK, server_extra=server) as gw:
        baseline = open_fds(gw.proc.pid)

        async def scenario() -> tuple[list[tuple[float, bytes]], int, int]:
            lorises = [
                asyncio.ensure_future(slowloris(gw.port, byte_at_a_time=i % 2 == 1))
                for i in range(SLOWLORIS)
            ]
            peak = baseline

            async def sample() -> None:  # the most connections the gateway held at once
                nonlocal peak
                while True:
                    peak = max(peak, open_fds(gw.proc.pid))
                    await asyncio.sleep(0.02)

            sampler = asyncio.ensure_future(sample())
            # wait until many are held (the kernel and a loaded machine take a moment to hand
            # a thousand connections over), well within the header timeout
            for _ in range(int(HEADER_TIMEOUT_S / 2 / 0.05)):
                if peak >= baseline + SLOWLORIS // 2:
                    break
                await asyncio.sleep(0.05)
            # a normal request made meanwhile is answered
            answer = await asyncio.wait_for(ask(gw.port, chat_request(gw.port, False)), 10)
            results = await asyncio.gather(*lorises)
            sampler.cancel()
            return results, answer.status, peak

        results, status, peak = asyncio.run(scenario())
        assert status == 200
        # they really were held open, many at once (a loaded machine accepts them more slowly
        # than the first are closed, so not necessarily all of them)
        assert peak >= baseline + SLOWLORIS // 4
        held = sorted(h for h, _ in results)
        # every one closed by the timeout: not before it (margin for scheduling), and soon after
        assert held[0] >= HEADER_TIMEOUT_S * 0.9, held[:5]
        assert held[-1] < HEADER_TIMEOUT_S + 10, held[-5:]
        answered = [got for _, got in results if got]
        assert answered and all(g.startswith(b"HTTP/1.1 408 ") for g in answered)
        assert b'"client_header_timeout"' in answered[0]
        deadline = time.monotonic() + 5
        while open_fds(gw.proc.pid) > baseline + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert open_fds(gw.proc.pid) <= baseline + 5


async def stalled_body(port: int, gap_s: float, pieces: int) -> tuple[Answer, float, bool]:
    """A request whose body arrives in ``pieces`` with ``gap_s`` between them after its first
    10 bytes (``pieces=0``: the rest never comes). Returns the answer, how long it took after
    the stall began, and whether the gateway then closed the connection."""
    request = chat_request(port, stream=False)
    head, body = request.split(b"\r\n\r\n", 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"\r\n\r\n" + body[:10])
    started = time.monotonic()
    if pieces > 0:
        step = -(-len(body[10:]) // pieces)
        for i in range(10, len(body), step):
            await asyncio.sleep(gap_s)
            writer.write(body[i : i + step])
    answer = await asyncio.wait_for(read_answer(reader), 20)
    took = time.monotonic() - started
    closed = False
    if answer.status != 200:  # a kept-alive connection would stay open until keep-alive ends
        closed = await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    return answer, took, closed


def test_a_body_that_stalls_gets_408_and_the_connection_is_closed(tmp_path):
    with gateway_process(tmp_path, MOCK, server_extra="client_body_timeout_s = 1") as gw:
        answer, took, closed = asyncio.run(stalled_body(gw.port, 0, pieces=0))
        assert answer.status == 408 and closed
        error = orjson.loads(answer.body)["error"]
        assert error["type"] == "request_timeout" and error["code"] == "client_body_timeout"
        assert took >= 0.8
        # a body that trickles with gaps under the timeout is read whole and answered
        answer, took, _ = asyncio.run(stalled_body(gw.port, 0.3, pieces=6))
        assert answer.status == 200 and took > 1.0  # longer than the timeout in all


def test_beyond_max_client_connections_new_ones_are_refused_open_ones_still_work(tmp_path):
    server = "max_client_connections = 20\nclient_header_timeout_s = 30"
    with gateway_process(tmp_path, MOCK, server_extra=server) as gw:

        async def scenario() -> None:
            conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(20)]
            for reader, writer in conns:
                writer.write(chat_request(gw.port, False))
                assert (await read_answer(reader)).status == 200
            refused = await asyncio.wait_for(ask(gw.port, chat_request(gw.port, False)), 5)
            assert refused.status == 503
            assert orjson.loads(refused.body)["error"]["code"] == "max_client_connections"
            assert refused.headers["connection"] == "close"
            reader, writer = conns[0]  # an open connection still works
            writer.write(chat_request(gw.port, False))
            assert (await read_answer(reader)).status == 200
            conns[1][1].close()  # one closes: room for a new one
            for _ in range(50):
                answer = await ask(gw.port, chat_request(gw.port, False))
                if answer.status == 200:
                    break
                await asyncio.sleep(0.05)
            assert answer.status == 200
            for _, w in conns:
                w.close()

        asyncio.run(asyncio.wait_for(scenario(), 30))
