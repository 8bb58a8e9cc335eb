"""gateway/server/http1.py, the HTTP/1.1 server protocol, on real sockets under
gateway/server/process.py's Server with a bare ASGI app: keep-alive, pipelining served in order,
HEAD, request bodies (content-length and chunked), ``Expect: 100-continue``, chunked answers,
the head's caps, a client that goes away."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.server.process import Server, bind
from gateway.server.state import ServerState
from tests.gateway_process import Answer, read_answer
from tests.support import until

#: an app bug, by path: a header that must never reach the wire
_BAD_HEADERS = {
    "/bad-value": [(b"x-a", b"v\r\nx-injected: 1")],
    "/bad-name": [(b"x a", b"v")],
}

#: what the app saw of each request that ended with a disconnect
DISCONNECTS: list[str] = []


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echoes the method, path and body; ``/slow`` answers after 0.3 s, ``/chunked`` answers
    without a content-length, ``/hang`` reads until the client goes away."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            DISCONNECTS.append(scope["path"])
            return
        body += message["body"]
        if not message["more_body"]:
            break
    path = scope["path"]
    if path == "/hang":
        message = await receive()
        DISCONNECTS.append(f"{path} {message['type']}")
        return
    if path == "/slow":
        await asyncio.sleep(0.3)
    out = orjson.dumps({"method": scope["method"], "path": path, "body": body.decode()})
    headers = [(b"content-type", b"application/json")]
    if path != "/chunked":
        headers.append((b"content-length", str(len(out)).encode()))
    headers += _BAD_HEADERS.get(path, [])
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/chunked":
        await send({"type": "http.response.body", "body": out[:5], "more_body": True})
        out = out[5:]
    await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def served() -> Iterator[Server]:
    sock = bind("127.0.0.1", 0)
    server = Server(ServerState(app), sock, grace_s=2.0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    yield server
    server.stop()
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def port(served: Server) -> int:
    return int(served.sock.getsockname()[1])


def request(path: str, body: bytes = b"", method: str = "POST", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: t\r\n{extra}"
    if method != "HEAD" and "transfer-encoding" not in extra:
        head += f"content-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def echoed(answer: Answer) -> dict[str, str]:
    assert answer.status == 200, answer
    return orjson.loads(answer.body)


async def talk(port: int, data: bytes, answers: int) -> tuple[list[Answer], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = [await asyncio.wait_for(read_answer(reader), 5) for _ in range(answers)]
    writer.write_eof()
    rest = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return got, rest


def test_keep_alive_and_pipelined_requests_answered_in_order(port):
    # three requests in one write, the first one slow: answered in the order they came
    data = request("/slow", b"a") + request("/b", b"bb") + request("/c", b"ccc")
    answers, rest = asyncio.run(talk(port, data, 3))
    assert [echoed(a)["path"] for a in answers] == ["/slow", "/b", "/c"]
    assert [echoed(a)["body"] for a in answers] == ["a", "bb", "ccc"]
    assert rest == b""


def test_head_chunked_bodies_and_chunked_answers(port):
    chunked = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    data = (
        request("/h", method="HEAD")
        + request("/te", chunked, extra="transfer-encoding: chunked\r\n")
        + request("/chunked", b"x")
    )

    async def scenario() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: " in head
        te = echoed(await asyncio.wait_for(read_answer(reader), 5))
        assert te == {"method": "POST", "path": "/te", "body": "abcde"}
        answer = await asyncio.wait_for(read_answer(reader), 5)
        assert answer.headers["transfer-encoding"] == "chunked"
        assert echoed(answer)["body"] == "x"
        writer.close()

    asyncio.run(scenario())


def test_expect_100_continue_is_answered_when_the_app_reads_the_body(port):
    async def scenario() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /e HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"body")
        assert echoed(await asyncio.wait_for(read_answer(reader), 5))["body"] == "body"
        writer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nhost: t\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(101)) + b"\r\n", 431),
        (b"POST / HTTP/1.1\r\ncontent-length: 1x\r\n\r\n", 400),
        (b"NOT HTTP\r\n\r\n", 400),
    ],
)
def test_the_head_caps_answer_and_close(port, data, status):
    (answer,), rest = asyncio.run(talk(port, data, 1))
    assert answer.status == status and answer.headers["connection"] == "close"
    assert "error" in orjson.loads(answer.body)
    assert rest == b""


def test_a_client_that_goes_away_is_a_disconnect_to_the_app(port):
    async def scenario() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("/hang", b"x"))
        await asyncio.sleep(0.2)
        writer.close()
        await until(lambda: "/hang http.disconnect" in DISCONNECTS, "the app saw it")
        # a body the client never finished: the app's receive() gives http.disconnect
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("/partial", b"abcdef")[:-3])
        await asyncio.sleep(0.2)
        writer.close()
        await until(lambda: "/partial" in DISCONNECTS, "the app saw it")

    asyncio.run(scenario())


@pytest.mark.parametrize("path", ["/bad-value", "/bad-name"])
def test_an_invalid_header_from_the_app_closes_without_a_byte_of_it(port, path):
    async def scenario() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(path, b"x"))
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return rest

    assert asyncio.run(scenario()) == b""


class _Wire:
    """A transport that records each write call (what the socket would get per syscall)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 1)

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize("follows", [True, False])
def test_a_whole_answer_is_one_write_and_a_lone_head_leaves_when_the_step_ends(follows: bool):
    """``gateway.body_follows`` on the head (what ResponseWriter.whole sends): no flush of its
    own, the body's write takes it (held even across a step); without it, a head no body
    follows in the same step goes out alone when the step ends, and the body after it."""
    from gateway.context import BODY_FOLLOWS
    from gateway.server.http1 import Http1Protocol

    async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"x-a", b"1"), (b"content-length", b"2")],
        }
        if follows:
            start[BODY_FOLLOWS] = True
        await send(start)
        await asyncio.sleep(0.01)  # the step ends: the head leaves alone unless held for the body
        await send({"type": "http.response.body", "body": b"hi"})

    async def scenario() -> list[bytes]:
        wire = _Wire()
        conn = Http1Protocol(ServerState(answer), asyncio.get_running_loop())
        conn.connection_made(wire)  # type: ignore[arg-type]
        conn.data_received(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        await until(lambda: conn.server_state.total_requests == 1, "answered")
        return wire.writes

    writes = asyncio.run(scenario())
    assert len(writes) == (1 if follows else 2)
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and b"x-a: 1\r\n" in writes[0]
    assert b"".join(writes).endswith(b"\r\n\r\nhi")
