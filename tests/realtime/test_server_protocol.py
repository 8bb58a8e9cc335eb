"""gateway/server/websocket.py, the client's WebSocket hop, on real sockets behind
gateway/server/http1.py (gateway/server/process.py's server runs it, as in
tests/test_http1.py): the handshake as ``websockets`` validates it, the ASGI scope and
messages, refusals before the accept, 1009 for a message over ``max_size`` (fragmented or not),
keepalive pings (answered: open; unanswered: 1011), and the server's shutdown (1012, or the
session's own drain)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.context import RECEIVED_AT
from gateway.realtime.client_end import CLIENT_END, READ_AT
from gateway.server.process import Server, bind
from gateway.server.state import ServerState
from gateway.server.websocket import RealtimeWebSocketProtocol
from tests.realtime.test_handshake import run

MAX_SIZE = 1024
KEY = "dGhlIHNhbXBsZSBub25jZQ=="

#: what the app saw: (scope, websocket.connect message, the other messages it received)
SEEN: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = []


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/refuse``: closed before the accept (403); ``/http``: a 418 answer; ``/drain``: the
    session registers a drain that closes it with 4000; anything else echoes each message."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    connect = await receive()
    received: list[dict[str, Any]] = []
    SEEN.append((scope, connect, received))
    path = scope["path"]
    if path == "/refuse":
        await send({"type": "websocket.close", "code": 1008})
        return
    if path == "/http":
        headers = [(b"content-type", b"text/plain"), (b"x-why", b"teapot")]
        await send({"type": "websocket.http.response.start", "status": 418, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": b"short", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b" and stout"})
        return
    if path == "/slow":  # the app takes its time to accept (auth, the upstream's handshake)
        await asyncio.sleep(0.6)
    if path == "/drain":
        loop = asyncio.get_running_loop()
        closing = {"type": "websocket.close", "code": 4000, "reason": "drained"}
        connect[CLIENT_END].drain = lambda: loop.create_task(send(closing))
    chosen = "b" if "b" in scope["subprotocols"] else None
    await send({"type": "websocket.accept", "subprotocol": chosen, "headers": [(b"x-hi", b"1")]})
    while True:
        message = await receive()
        received.append(message)
        if message["type"] == "websocket.disconnect":
            return
        await send({**message, "type": "websocket.send"})


class Served:
    """gateway/server/process.py's server, on its own thread, with WebSocket upgrades on."""

    def __init__(self) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.port = int(self.sock.getsockname()[1])
        state = ServerState(app, ws_enabled=True, ws_max_size=MAX_SIZE)
        self.server = Server(state, self.sock, grace_s=5.0)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.stopped = False

    def start(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.server.stop()
        self.thread.join(10)
        self.sock.close()

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"


@pytest.fixture
def server() -> Iterator[Served]:
    SEEN.clear()
    srv = Served().start()
    yield srv
    srv.stop()


async def raw(port: int, head: bytes, wait: float = 5.0) -> bytes:
    """Everything the server sends on a raw connection after ``head``, until it closes."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, head)
    got = b""
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), wait):
            got += chunk
    finally:
        sock.close()
    return got


def handshake(extra: str = f"Sec-WebSocket-Key: {KEY}\r\n", method: str = "GET") -> bytes:
    return (
        f"{method} /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """The server's (unmasked, short) frames: (opcode, payload)."""
    out = []
    while data:
        opcode, size = data[0] & 0x0F, data[1] & 0x7F
        assert size < 126 and not data[1] & 0x80
        out.append((opcode, data[2 : 2 + size]))
        data = data[2 + size :]
    return out


def test_a_handshake_websockets_refuses_is_answered_and_closed(server):
    answer = run(raw(server.port, handshake(extra="")))  # no Sec-WebSocket-Key
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"Sec-WebSocket-Key" in body
    answer = run(raw(server.port, handshake(method="POST")))
    # a request websockets' parser refuses: 400 (websockets 17 answers it itself, with 405)
    assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 405 "))
    assert b"Failed to open a WebSocket connection" in answer
    assert SEEN == []  # the app never saw either


def test_the_scope_and_messages_the_app_gets(server):
    async def main() -> tuple[str | None, str | None]:
        async with connect(server.url("/%65cho%20x/?q=1"), subprotocols=["a", "b"]) as ws:
            await ws.send("héllo")
            assert await ws.recv() == "héllo"
            await ws.send(b"\x00\x01")
            assert await ws.recv() == b"\x00\x01"
            return ws.subprotocol, ws.response.headers.get("x-hi")

    began = time.perf_counter()
    assert run(main()) == ("b", "1")
    ((scope, connect_, received),) = SEEN
    assert scope["type"] == "websocket" and scope["scheme"] == "ws"
    # the canonical target in both (docs/spec.md §25): one spelling, whatever the client wrote
    assert scope["path"] == "/echo%20x" and scope["raw_path"] == b"/echo%20x"
    assert scope["query_string"] == b"q=1" and scope["subprotocols"] == ["a", "b"]
    assert scope["asgi"]["version"] == "3.0" and scope["root_path"] == ""
    assert scope["client"][0] == scope["server"][0] == "127.0.0.1"
    assert (b"sec-websocket-protocol", b"a, b") in scope["headers"]
    assert "websocket.http.response" in scope["extensions"] and scope["state"] == {}
    assert isinstance(connect_[CLIENT_END], RealtimeWebSocketProtocol)
    assert began < connect_[RECEIVED_AT] < time.perf_counter()
    assert [m.get("text", m.get("bytes")) for m in received[:2]] == ["héllo", b"\x00\x01"]
    assert all(began < m[READ_AT] < time.perf_counter() for m in received[:2])
    assert received[2]["type"] == "websocket.disconnect" and received[2]["code"] == 1000


def test_refusals_before_the_accept_are_http(server):
    async def main() -> list[Any]:
        out = []
        for path in ("/refuse", "/http"):
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.url(path)):
                    pass
            out.append(info.value.response)
        return out

    refused, teapot = run(main())
    assert refused.status_code == 403
    assert (teapot.status_code, teapot.body) == (418, b"short and stout")
    assert teapot.headers["x-why"] == "teapot" and teapot.headers["content-length"] == "15"


@pytest.mark.parametrize("fragments", [1, 3], ids=["one-frame", "fragmented"])
def test_a_message_over_max_size_closes_1009(server, fragments):
    async def main() -> int | None:
        async with connect(server.url("/echo"), max_size=None) as ws:
            await ws.send("y" * MAX_SIZE)  # at the limit: fine
            assert await ws.recv() == "y" * MAX_SIZE
            await ws.send(["z" * 400] * fragments if fragments > 1 else "z" * (MAX_SIZE + 1))
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            return ws.protocol.close_rcvd.code if ws.protocol.close_rcvd else None

    assert run(main()) == 1009
    ((_, _, received),) = SEEN
    assert received[-1]["type"] == "websocket.disconnect" and received[-1]["code"] == 1009


@pytest.fixture
def fast_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RealtimeWebSocketProtocol, "ping_interval", 0.2)
    monkeypatch.setattr(RealtimeWebSocketProtocol, "ping_timeout", 0.3)


def test_keepalive_pings_keep_an_answering_client_and_close_a_silent_one_1011(server, fast_pings):
    async def answering() -> str:
        async with connect(server.url("/echo"), ping_interval=None) as ws:
            await asyncio.sleep(1.2)  # several pings, each answered by websockets
            await ws.send("still here")
            return str(await ws.recv())

    assert run(answering()) == "still here"
    # a client that never reads (so never answers): pinged, then closed 1011 once overdue
    began = time.monotonic()
    got = run(raw(server.port, handshake()))
    took = time.monotonic() - began
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    sent = frames(rest)
    assert [op for op, _ in sent] == [0x9, 0x8]  # one ping, then the close
    assert int.from_bytes(sent[1][1][:2], "big") == 1011
    assert 0.4 < took < 3


def sessions_at_shutdown(server: Served, path: str) -> tuple[int | None, str | None]:
    async def main() -> tuple[int | None, str | None]:
        async with connect(server.url(path)) as ws:
            await ws.send("x")
            await ws.recv()
            threading.Thread(target=server.stop).start()
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            rcvd = ws.protocol.close_rcvd
            return (rcvd.code, rcvd.reason) if rcvd is not None else (None, None)

    got: tuple[int | None, str | None] = run(main())
    return got


def test_shutdown_during_the_handshake_lets_it_finish_then_closes_1012(server):
    async def main() -> tuple[int | None, str | None]:
        threading.Timer(0.2, server.stop).start()  # while the app has not accepted yet
        async with connect(server.url("/slow")) as ws:
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            rcvd = ws.protocol.close_rcvd
            return (rcvd.code, rcvd.reason) if rcvd is not None else (None, None)

    assert run(main()) == (1012, "")
    ((_, _, received),) = SEEN
    assert received[-1]["type"] == "websocket.disconnect" and received[-1]["code"] == 1012


def test_shutdown_closes_1012_or_lets_the_session_drain(server):
    assert sessions_at_shutdown(server, "/echo") == (1012, "")
    other = Served().start()
    try:
        assert sessions_at_shutdown(other, "/drain") == (4000, "drained")
    finally:
        other.stop()
