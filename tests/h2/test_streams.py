"""Streams on one HTTP/2 connection (docs/spec.md §27): flow control is backpressure per stream,
a client's RST_STREAM is a disconnect (499, the upstream attempt cancelled, priced as a cut
stream), and SIGTERM's GOAWAY lets the streams in flight finish."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import orjson
from h2.errors import ErrorCodes

from gateway.config import Config
from tests.h2.support import MOCK, Certs, H2Client, http2_client
from tests.support import (
    GatewayServer,
    SeenRequest,
    chat_chunk,
    chunk,
    config_for,
    gateway_config,
    openai_client,
    paced_upstream,
    sse_head,
)

NO_CACHE = '[cache]\nbackend = "off"\n'
STREAM = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
)
JSON = [("content-type", "application/json"), ("accept-encoding", "identity")]
HI = [{"role": "user", "content": "hi"}]


def big_stream(events: int = 400, size: int = 600):
    """An upstream chat stream of ``events`` events of ``size`` bytes each, sent at once."""
    word = "w" * size

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        for _ in range(events):
            writer.write(chunk(chat_chunk(word)))
        writer.write(chunk(chat_chunk(None, finish="stop")) + chunk(b"data: [DONE]\n\n"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return handler


class Held:
    """An upstream stream that sends a few events, then holds until released (or cut)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()

    async def handle(self, req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        try:
            for _ in range(3):
                writer.write(chunk(chat_chunk("word")))
                await writer.drain()
            while not self.release.is_set():
                await asyncio.sleep(0.05)
                writer.write(chunk(b": keep-alive\n\n"))  # a cut connection shows here
                await writer.drain()
        except ConnectionError:
            self.closed.set()
            return False
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True


def test_a_slow_reader_stalls_only_its_own_stream(gateway, upstream, certs: Certs):
    up = upstream(big_stream())
    gw = gateway(config_for(up.url, extra=NO_CACHE + certs.toml()))
    with H2Client(gw.port, certs.client_context()) as c:
        slow = c.request("POST", "/v1/chat/completions", STREAM, JSON)
        c.hold = {slow}  # its DATA is never acknowledged: its window shuts
        others = [c.request("POST", "/v1/chat/completions", STREAM, JSON) for _ in range(20)]
        assert c.until(lambda: all(c.answers[s].ended for s in others), 20)
        for sid in others:
            assert c.answers[sid].body.rstrip().endswith(b"data: [DONE]")
        stalled = c.answers[slow]
        assert not stalled.ended and stalled.reset is None
        assert 0 < len(stalled.body) <= 65_535  # one window, not the ~250 KB it has
        # the client reads again: the stream finishes
        c.release(slow)
        assert c.answer(slow, 20).ended
        assert stalled.body.rstrip().endswith(b"data: [DONE]")


def test_a_client_reset_is_a_499_and_cancels_the_upstream(gateway, upstream, certs, access_lines):
    held = Held()
    up = upstream(held.handle)
    gw = gateway(config_for(up.url, extra=NO_CACHE + certs.toml()))
    try:
        with H2Client(gw.port, certs.client_context()) as c:
            sid = c.request("POST", "/v1/chat/completions", STREAM, JSON)
            assert c.until(lambda: c.answers[sid].body.count(b'"word"') == 3)
            c.conn.reset_stream(sid, ErrorCodes.CANCEL)
            c.flush()
            assert held.closed.wait(5), "the upstream attempt was not cancelled"
            # the connection goes on serving
            assert c.answer(c.request("GET", "/healthz")).status == 200
    finally:
        held.release.set()
    deadline = time.monotonic() + 5
    while not any(r["path"] == "/v1/chat/completions" for r in access_lines):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (line,) = [r for r in access_lines if r["path"] == "/v1/chat/completions"]
    assert line["status"] == 499
    assert line["tokens"]["output"] == 3  # priced as a cut stream: what was relayed


def test_an_sdk_gone_mid_stream_is_a_499(gateway, upstream, certs, access_lines):
    """httpcore leaves a closed response's stream open (no RST_STREAM): what ends it is its
    client's connection closing, which every stream on it sees as its client going away."""
    held = Held()
    up = upstream(held.handle)
    gw = gateway(config_for(up.url, extra=NO_CACHE + certs.toml()))
    try:
        http = http2_client(certs)
        client = openai_client(gw.base_url, http_client=http)
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert next(iter(stream)).choices[0].delta.content == "word"
        stream.close()
        http.close()
        assert held.closed.wait(5), "the upstream attempt was not cancelled"
    finally:
        held.release.set()
    deadline = time.monotonic() + 5
    while not access_lines:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert access_lines[0]["status"] == 499


@contextlib.contextmanager
def stopped_by_the_test(config: Config) -> Iterator[GatewayServer]:
    """A gateway the test drains itself (``server.stop()``, SIGTERM's drain)."""
    gw = GatewayServer(config).start()
    try:
        yield gw
    finally:
        if gw.thread.is_alive():
            gw.stop()
        gw.thread.join(10)
        gw.sock.close()


def test_shutdown_lets_the_streams_in_flight_finish_then_sends_goaway(upstream, certs):
    """SIGTERM's drain: the streams in flight finish — and a stream opened meanwhile is served
    — then GOAWAY NO_ERROR naming the last stream taken, and the close. The GOAWAY waits for
    the streams: an httpx client fails every stream in flight when one arrives."""
    sent: list[float] = []
    up = upstream(paced_upstream(sent, gap=0.1))
    config = config_for(up.url, extra=NO_CACHE + certs.toml())
    with stopped_by_the_test(config) as gw, H2Client(gw.port, certs.client_context()) as c:
        first = c.request("POST", "/v1/chat/completions", STREAM, JSON)
        assert c.until(lambda: b"Streams" in c.answers[first].body)
        stopper = threading.Thread(target=gw.server.stop)  # SIGTERM's drain
        stopper.start()
        draining = gw.server.state.connections
        while not any(getattr(conn, "ending", None) for conn in list(draining)):
            time.sleep(0.01)
        second = c.request("GET", "/healthz")
        assert c.answer(second).status == 200
        answer = c.answer(first)
        assert answer.ended and answer.body.rstrip().endswith(b"data: [DONE]")
        assert c.until_closed()
        assert c.order == [("ended", second), ("ended", first), ("goaway", second)]
        assert c.goaway is not None and c.goaway.error_code == ErrorCodes.NO_ERROR
        assert c.goaway.additional_data == b"shutdown"
        stopper.join(10)
        gw.thread.join(10)
        assert not gw.thread.is_alive()


def test_an_sdk_stream_in_flight_survives_the_shutdown(certs):
    """The OpenAI SDK on an HTTP/2 client streams through a drain to its end."""
    mock = MOCK.replace('url = "mock://"', 'url = "mock://?tokens_per_s=40"')
    with stopped_by_the_test(gateway_config(mock + certs.toml())) as gw:
        with http2_client(certs) as http:
            client = openai_client(gw.base_url, http_client=http)
            stream = client.chat.completions.create(
                model="gpt-4o", messages=HI, stream=True, max_tokens=20
            )
            chunks = iter(stream)
            assert next(chunks).choices[0].delta.role == "assistant"
            threading.Thread(target=gw.server.stop).start()
            rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"
        assert sum(bool(c.choices[0].delta.content) for c in rest) == 20


def test_a_connection_never_idle_gets_its_goaway_at_twice_the_cap(gateway, upstream):
    """max_requests_per_connection = 2 on a connection always busy: at the 4th stream GOAWAY
    goes out at once naming it; a stream the client opened before reading it is refused
    (REFUSED_STREAM: never run, safe to retry), those taken finish."""
    held = Held()
    up = upstream(held.handle)
    server = "[server]\nh2c = true\n[server.http2]\nmax_requests_per_connection = 2\n"
    gw = gateway(config_for(up.url, extra=NO_CACHE + server))
    try:
        with H2Client(gw.port) as c:
            taken = [c.request("POST", "/v1/chat/completions", STREAM, JSON) for _ in range(4)]
            # frames follow the GOAWAY meanwhile (the held streams' keep-alives, every 50 ms),
            # as on a busy machine: the client must still see the GOAWAY and then the refusal
            time.sleep(0.3)
            c.read_until_goaway()  # in, not read: the client opens a stream meanwhile
            late = c.request("GET", "/healthz")
            assert c.answer(late).reset == ErrorCodes.REFUSED_STREAM, (c.errors, c.goaway)
            assert c.goaway is not None and c.goaway.last_stream_id == taken[-1]
            held.release.set()
            for sid in taken:
                assert c.answer(sid).body.rstrip().endswith(b"data: [DONE]")
            assert c.until_closed()
    finally:
        held.release.set()
