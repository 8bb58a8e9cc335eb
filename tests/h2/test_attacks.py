"""The HTTP/2 attacks of the last years against the gateway's own edge (docs/spec.md §27), each
driven with raw frames on one connection of a gateway process: the connection is cut (GOAWAY
ENHANCE_YOUR_CALM) or the stream limited, what the attack made the gateway do stays within the
configured bounds, and — the event loop and memory bounded — ``/healthz`` on another connection
answers meanwhile and the process's RSS barely moves. Checked by behaviour, never by timings."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hpack
import httpx2
import orjson
import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    ExtensionFrame,
    Frame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from tests.gateway_process import gateway_process, rss_kb
from tests.h2.support import FrameClient, H2Client, handshake
from tests.support import Process, ScriptedUpstream, answering

CALM = ErrorCodes.ENHANCE_YOUR_CALM
#: what an attack may grow the gateway's RSS by (an unbounded one allocates per frame or stream:
#: hundreds of MiB for the floods sent here)
RSS_SLACK_KB = 32 * 1024

LIMITS = """
[server.http2]
max_concurrent_streams = 20
max_header_list_bytes = 16384
max_continuation_frames = 4
max_requests_per_connection = 50
idle_timeout_s = 3
stalled_stream_timeout_s = 1
resets_per_s = 5
reset_burst = 50
control_frames_per_s = 50
control_frame_burst = 200
"""
HI = [{"role": "user", "content": "hi"}]
CHAT_JSON = orjson.dumps({"model": "m", "messages": HI})


@dataclass
class Target:
    proc: Process
    upstream: ScriptedUpstream

    @property
    def port(self) -> int:
        return self.proc.port

    def rss(self) -> int:
        return rss_kb(self.proc.proc.pid)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One gateway (h2c beside HTTP/1.1) for every attack: it must outlive them all."""
    up = ScriptedUpstream(answering(b'{"object": "chat.completion", "choices": []}')).start()
    body = f"""
[[backends]]
name = "up"
url = "{up.url}"

[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
models = ["m"]
backends = ["up"]

[[routes]]
models = ["*"]
backends = ["mock"]

[cache]
backend = "off"
{LIMITS}"""
    tmp = tmp_path_factory.mktemp("attacks")
    server = "h2c = true\nclient_header_timeout_s = 2\n"
    try:
        with gateway_process(Path(tmp), body, server_extra=server) as proc:
            target = Target(proc, up)
            healthy(target)  # warmed up: the RSS baselines below are the steady state
            yield target
    finally:
        up.stop()


def healthy(target: Target) -> None:
    """``/healthz`` answers on a connection of its own (HTTP/1.1)."""
    answer = httpx2.get(f"http://127.0.0.1:{target.port}/healthz", timeout=10)
    assert answer.status_code == 200


@contextlib.contextmanager
def bounded(target: Target) -> Iterator[list[int]]:
    """While the body runs, ``/healthz`` is asked again and again on its own connections; after
    it, every one of them answered and the RSS grew by less than :data:`RSS_SLACK_KB`."""
    before = target.rss()
    statuses: list[int] = []
    done = threading.Event()

    def ask() -> None:
        with httpx2.Client(timeout=10) as http:
            while not done.is_set() or not statuses:
                statuses.append(http.get(f"http://127.0.0.1:{target.port}/healthz").status_code)

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        yield statuses
    finally:
        done.set()
        asker.join(30)
    assert statuses and set(statuses) == {200}, statuses
    healthy(target)
    grown = target.rss() - before
    assert grown < RSS_SLACK_KB, f"RSS grew by {grown} KiB"


class Headers:
    """HEADERS blocks of one connection (one HPACK encoder: its table is the server's)."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def block(self, method: str = "GET", path: str = "/healthz", *extra: tuple[str, str]) -> bytes:
        head = [(":method", method), (":scheme", "http"), (":path", path)]
        return self.encoder.encode([*head, (":authority", "127.0.0.1"), *extra])

    def frame(self, sid: int, *flags: str, method: str = "GET", path: str = "/healthz") -> Frame:
        return HeadersFrame(sid, self.block(method, path), flags=["END_HEADERS", *flags])


def flood(client: FrameClient, frames: Callable[[int], list[Frame]], rounds: int) -> int:
    """Send ``frames(i)`` for i in range(rounds), in batches, until the server cuts the
    connection; what was sent."""
    sent = 0
    for start in range(0, rounds, 100):
        batch = [f for i in range(start, min(rounds, start + 100)) for f in frames(i)]
        if not client.send(*batch):
            break
        sent += len(batch)
        client.poll()
        if client.closed or client.goaway() is not None:
            break
    return sent


def cut_with(client: FrameClient, code: int) -> None:
    assert client.until_closed(), "the connection was not closed"
    goaway = client.goaway()
    assert goaway is not None, [type(f).__name__ for f in client.frames[-5:]]
    assert goaway.error_code == code, goaway


def test_rapid_reset_is_answered_with_enhance_your_calm(target):
    """CVE-2023-44487: streams opened and reset at once. A reset stream keeps its slot until
    its request's task is done, and the resets past the bucket end the connection: the
    upstream sees a bounded number of requests, whatever the client sent."""
    before = len(target.upstream.requests)
    headers = Headers()
    with bounded(target), FrameClient(target.port) as c:
        handshake(c)

        def open_and_reset(i: int) -> list[Frame]:
            sid = 2 * i + 1
            frame = HeadersFrame(sid, headers.block("POST", "/v1/chat/completions"))
            frame.flags.add("END_HEADERS")
            return [frame, DataFrame(sid, CHAT_JSON, flags=["END_STREAM"]), RstStreamFrame(sid, 8)]

        sent = flood(c, open_and_reset, 5000)
        cut_with(c, CALM)
    served = len(target.upstream.requests) - before
    assert sent >= 3 * 51  # more resets than the bucket holds were sent before the cut
    assert served <= 50 + 20, served  # reset_burst + max_concurrent_streams


def test_a_header_list_over_its_limit_ends_the_connection(target):
    """The decoded list counted as RFC 9113 §6.5.2 does (32 octets a field): 600 small fields
    of ~38 octets each are over 16384 although they compress to a fraction of it."""
    headers = Headers()
    fields = [(f"x-f{i}", "v") for i in range(600)]
    with bounded(target), FrameClient(target.port) as c:
        handshake(c)
        block = headers.encoder.encode(
            [(":method", "GET"), (":scheme", "http"), (":path", "/healthz"),
             (":authority", "127.0.0.1"), *fields]
        )  # fmt: skip
        assert len(block) < 16384
        c.send(HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"]))
        cut_with(c, CALM)


@pytest.mark.parametrize("shape", ["many frames", "many bytes"])
def test_continuation_floods_are_bounded(target, shape):
    """CVE-2024-27316 and its kin: a header block that never ends, in many small CONTINUATION
    frames or in a few big ones, is cut at max_continuation_frames or max_header_list_bytes."""
    headers = Headers()
    with bounded(target), FrameClient(target.port) as c:
        handshake(c)
        c.send(HeadersFrame(1, headers.block(), flags=["END_STREAM"]))
        size = 1 if shape == "many frames" else 15000
        sent = flood(c, lambda i: [ContinuationFrame(1, b"\x00" * size)], 5000)
        cut_with(c, CALM)
    assert sent > 4


def test_a_header_block_that_stops_coming_is_closed(target):
    headers = Headers()
    with FrameClient(target.port) as c:
        handshake(c)
        c.send(HeadersFrame(1, headers.block(), flags=["END_STREAM"]))  # no END_HEADERS
        cut_with(c, ErrorCodes.NO_ERROR)  # after client_header_timeout_s


FLOODS: dict[str, Callable[[int], list[Frame]]] = {
    "SETTINGS": lambda i: [SettingsFrame(0, settings={0x3: 100})],
    "PING": lambda i: [PingFrame(0, i.to_bytes(8, "big"))],
    "PRIORITY": lambda i: [PriorityFrame(2 * i + 101, depends_on=0, stream_weight=16)],
    "WINDOW_UPDATE": lambda i: [WindowUpdateFrame(0, 1)],
    "empty DATA": lambda i: [DataFrame(1, b"")],
    "unknown frames": lambda i: [ExtensionFrame(0x20 + i % 16, 0, 0, b"")],
}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_control_frame_floods_are_bounded(target, kind):
    """CVE-2019-9512 (PING), -9515 (SETTINGS), -9516 and -9518 (empty frames), WINDOW_UPDATE
    and PRIORITY floods: frames that carry no request cost tokens of one bucket; the flood is
    cut where it is seen — the acknowledgements the gateway wrote for it are a bounded few."""
    headers = Headers()
    with bounded(target), FrameClient(target.port) as c:
        handshake(c)
        if kind == "empty DATA":  # a request whose body never comes, in empty frames
            c.send(headers.frame(1, method="POST", path="/v1/chat/completions"))
        sent = flood(c, FLOODS[kind], 20000)
        cut_with(c, CALM)
    acks = sum(isinstance(f, PingFrame | SettingsFrame) for f in c.frames)
    assert acks <= 200 + 2, acks  # the burst, the server's own SETTINGS and its ACK
    assert sent > 200


def test_a_stream_stalled_at_a_zero_window_is_reaped(target):
    """A client that opens no window (SETTINGS_INITIAL_WINDOW_SIZE 0) never takes the answer:
    after stalled_stream_timeout_s the stream is reset and its request ends as 499."""
    with bounded(target), H2Client(target.port, settings={0x4: 0}) as c:
        body = orjson.dumps({"model": "gpt-4o", "stream": True, "max_tokens": 5000, "messages": HI})
        sid = c.request(
            "POST", "/v1/chat/completions", body, [("content-type", "application/json")]
        )
        answer = c.answer(sid, 20)
        assert answer.status == 200 and answer.reset == ErrorCodes.CANCEL and answer.body == b""
    metrics = httpx2.get(f"http://127.0.0.1:{target.port}/metrics").text
    assert 'status_code="499"' in metrics


def test_concurrent_streams_are_capped(target):
    """Past max_concurrent_streams a stream is refused (REFUSED_STREAM: retryable), never run."""
    body = orjson.dumps({"model": "gpt-4o", "max_tokens": 1, "messages": HI})
    slow = [("content-type", "application/json"), ("x-mock-ttft-ms", "1500")]
    with H2Client(target.port) as c:
        sids = [c.request("POST", "/v1/chat/completions", body, slow) for _ in range(25)]
        answers = [c.answer(sid, 20) for sid in sids]
    refused = [a for a in answers if a.reset == ErrorCodes.REFUSED_STREAM]
    assert len(refused) == 5
    assert [a.status for a in answers if a.reset is None] == [200] * 20


def test_requests_per_connection_are_capped(target):
    """After max_requests_per_connection streams: GOAWAY NO_ERROR naming the last one taken;
    those are answered, and the connection closes."""
    with H2Client(target.port) as c:
        sids = []
        for _ in range(50):
            assert c.goaway is None
            sids.append(c.request("GET", "/healthz"))
            assert c.answer(sids[-1]).status == 200
        assert c.until(lambda: c.goaway is not None)
        assert c.goaway.error_code == ErrorCodes.NO_ERROR
        assert c.goaway.last_stream_id == sids[-1]
        assert c.until_closed()


def test_an_idle_connection_is_closed_with_goaway(target):
    """Never silently: a client that would reuse it reads the GOAWAY first."""
    with H2Client(target.port) as c:
        assert c.answer(c.request("GET", "/healthz")).status == 200
        assert c.until_closed(15)
        assert c.goaway is not None and c.goaway.error_code == ErrorCodes.NO_ERROR
        assert c.goaway.additional_data == b"idle_timeout"
