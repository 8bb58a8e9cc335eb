"""SPEC §8 stream validation over real sockets: real upstream faults, and what the client sees.

Every fault is made by a scripted upstream writing raw bytes (a reset, a stream without
``data: [DONE]``, a stall, bad framing, a short body). The client side is read raw (and
decoded with the reference libraries when compressed) and through the official openai SDK,
which must raise ``openai.APIError`` — never a connection error, never a silently short answer.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import brotli
import httpx2
import openai
import orjson
import pytest

from tests.support import (
    LAST_CHUNK,
    SeenRequest,
    chat_chunk,
    chunk,
    config_for,
    openai_client,
    sse_head,
)

NO_CACHE = '[cache]\nbackend = "off"'
IDLE = "stream_idle_timeout_s = 0.5"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}
FIRST = [chat_chunk("Hello"), chat_chunk(" world")]

Handler = Callable[[SeenRequest, Any], Awaitable[bool | None]]


# ---------------------------------------------------------------- faulty upstreams


def after_events(ending: str, events: list[bytes] = FIRST) -> Handler:
    """An SSE upstream that sends ``events`` and then ends the way ``ending`` says."""

    async def handler(req: SeenRequest, writer: Any) -> bool:
        if ending == "content-length short":
            # an SSE body framed by Content-Length, the connection closed early
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: 5000\r\n\r\n" + b"".join(events)
            )
        else:
            writer.write(sse_head() + b"".join(chunk(e) for e in events))
        await writer.drain()
        await asyncio.sleep(0.05)  # the events are relayed before the fault
        if ending == "reset":
            writer.transport.abort()
            return False
        if ending == "clean end without [DONE]":
            writer.write(LAST_CHUNK)
            return True
        if ending == "end in the middle of an event":
            writer.write(chunk(b'data: {"id": "chatcmpl-t", "obj') + LAST_CHUNK)
            return True
        if ending == "truncated chunk":
            writer.write(b"100\r\n" + b"data: {" + b"x" * 40)
            await writer.drain()
            return False
        if ending == "close without last chunk":
            return False
        if ending == "content-length short":
            return False
        if ending == "stall":
            await asyncio.sleep(4)
            return False
        raise AssertionError(ending)

    return handler


#: fault -> the SSE error type the client must see
MID_STREAM = {
    "reset": "upstream_stream_truncated",
    "clean end without [DONE]": "upstream_stream_truncated",
    "end in the middle of an event": "upstream_stream_truncated",
    "truncated chunk": "upstream_stream_truncated",
    "close without last chunk": "upstream_stream_truncated",
    "content-length short": "upstream_stream_truncated",
    "stall": "upstream_stream_idle_timeout",
}


def raw_response(head: bytes, body: bytes = b"", then: str = "close") -> Handler:
    async def handler(req: SeenRequest, writer: Any) -> bool:
        writer.write(head + body)
        await writer.drain()
        if then == "reset":
            await asyncio.sleep(0.05)
            writer.transport.abort()
        if then == "stall":
            await asyncio.sleep(4)
        return False

    return handler


# ---------------------------------------------------------------- the client side


def decoder(coding: str | None) -> Callable[[bytes], bytes]:
    if coding is None:
        return lambda b: b
    if coding == "gzip":
        z = zlib.decompressobj(16 + zlib.MAX_WBITS)

        def gz(b: bytes) -> bytes:
            out = z.decompress(b)
            if not b:
                assert z.eof, "gzip stream not finished"
            return out

        return gz
    if coding == "br":
        d = brotli.Decompressor()

        def br(b: bytes) -> bytes:
            out: bytes = d.process(b)
            if not b:
                assert d.is_finished(), "br stream not finished"
            return out

        return br
    raise AssertionError(coding)


@dataclass
class StreamRead:
    status: int
    headers: httpx2.Headers
    body: bytes  # decoded
    events: list[bytes] = field(default_factory=list)


def read_stream(url: str, accept: str, payload: dict[str, Any] = STREAM) -> StreamRead:
    """POST and read the whole answer raw; a connection dropped before the end of the body
    raises (httpx2.RemoteProtocolError), so returning means the stream ended cleanly."""
    with (
        httpx2.Client(timeout=20) as client,
        client.stream("POST", url, json=payload, headers={"accept-encoding": accept}) as resp,
    ):
        decode = decoder(resp.headers.get("content-encoding"))
        parts = [decode(raw) for raw in resp.iter_raw()]
        parts.append(decode(b""))  # end of input: the coded stream must be complete
    body = b"".join(parts)
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    assert body.endswith(b"\n\n") or not body, body[-200:]
    return StreamRead(resp.status_code, resp.headers, body, events)


def assert_error_event(event: bytes, type_: str) -> dict[str, Any]:
    assert event.startswith(b"data: "), event
    obj = orjson.loads(event[len(b"data: ") :])
    assert set(obj) == {"error"}
    err = obj["error"]
    assert err["type"] == type_, err
    assert err["code"] == 502
    assert err.get("param") is None
    assert isinstance(err["message"], str) and err["message"]
    return err


def assert_openai_error(resp: httpx2.Response, status: int, type_: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert "content-encoding" not in resp.headers
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert err["type"] == type_ and err["param"] is None and err["message"]
    return err


def sdk(gw: Any) -> openai.OpenAI:
    return openai_client(gw.base_url, timeout=20)


# ---------------------------------------------------------------- cut after events: SSE error


@pytest.mark.parametrize("accept", ["identity", "gzip", "br"])
@pytest.mark.parametrize("fault", list(MID_STREAM))
def test_stream_cut_after_events_ends_with_the_error_event(gateway, upstream, fault, accept):
    up = upstream(after_events(fault))
    gw = gateway(config_for(up.url, backend_extra=IDLE, extra=NO_CACHE))
    got = read_stream(gw.base_url + "/chat/completions", accept)
    assert got.status == 200
    assert got.headers["content-type"] == "text/event-stream"
    assert got.headers.get("content-encoding", "identity") == accept
    # the events before the fault, then exactly one error event, then the end of the stream
    assert got.events[:-1] == FIRST, got.body
    assert_error_event(got.events[-1], MID_STREAM[fault])
    assert b"data: [DONE]\n\n" not in got.events
    assert len(up.requests) == 1  # a stream that started is never retried


@pytest.mark.parametrize("fault", list(MID_STREAM))
def test_sdk_raises_api_error_on_a_cut_stream(gateway, upstream, fault):
    up = upstream(after_events(fault))
    gw = gateway(config_for(up.url, backend_extra=IDLE, extra=NO_CACHE))
    text: list[str] = []
    with sdk(gw) as client:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        with pytest.raises(openai.APIError) as info:
            for c in stream:
                if c.choices and c.choices[0].delta.content:
                    text.append(c.choices[0].delta.content)
    # a plain APIError from the error event: not APIConnectionError (a dropped connection)
    # and not APIStatusError (there was a 200)
    assert type(info.value) is openai.APIError, repr(info.value)
    assert isinstance(info.value.body, dict)
    assert info.value.body["type"] == MID_STREAM[fault]
    assert info.value.body["code"] == 502
    assert "".join(text) == "Hello world"  # what came before the cut was delivered


def gzip_stream_then(ending: str) -> Handler:
    """A gzip-coded SSE upstream (flushed per event) whose coding breaks after two events."""

    async def handler(req: SeenRequest, writer: Any) -> bool:
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        writer.write(sse_head([("content-encoding", "gzip")]))
        for event in FIRST:
            writer.write(chunk(z.compress(event) + z.flush(zlib.Z_SYNC_FLUSH)))
        await writer.drain()
        await asyncio.sleep(0.05)
        if ending == "corrupt":
            writer.write(chunk(b"\xff" * 64) + LAST_CHUNK)
        else:  # the HTTP body ends cleanly, the gzip stream does not (no [DONE], no trailer)
            writer.write(LAST_CHUNK)
        return True

    return handler


@pytest.mark.parametrize("ending", ["corrupt", "gzip unfinished"])
@pytest.mark.parametrize("accept", ["identity", "gzip"])
def test_broken_upstream_coding_mid_stream_ends_with_the_error_event(
    gateway, upstream, ending, accept
):
    up = upstream(gzip_stream_then(ending))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    got = read_stream(gw.base_url + "/chat/completions", accept)
    assert got.status == 200
    assert got.events[:-1] == FIRST, got.body
    assert_error_event(got.events[-1], "upstream_stream_truncated")


def test_idle_timeout_cuts_within_bounds(gateway, upstream):
    """The idle cut comes after stream_idle_timeout_s, not at the upstream's whim (bounded)."""
    up = upstream(after_events("stall"))
    gw = gateway(config_for(up.url, backend_extra=IDLE, extra=NO_CACHE))
    start = time.monotonic()
    got = read_stream(gw.base_url + "/chat/completions", "identity")
    elapsed = time.monotonic() - start
    assert_error_event(got.events[-1], "upstream_stream_idle_timeout")
    assert "0.5" in orjson.loads(got.events[-1][6:])["error"]["message"]
    assert 0.5 <= elapsed < 3.5  # the upstream would have stalled for 4 s


def test_keepalive_comments_reset_the_idle_timer(gateway, upstream):
    """An upstream that is slow but alive (a comment every 0.3 s) is not cut at 0.5 s idle."""

    async def handler(req: SeenRequest, writer: Any) -> bool:
        writer.write(sse_head() + chunk(FIRST[0]))
        for _ in range(4):
            await asyncio.sleep(0.3)
            writer.write(chunk(b": keep-alive\n\n"))
            await writer.drain()
        writer.write(chunk(FIRST[1]) + chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        return True

    gw = gateway(config_for(upstream(handler).url, backend_extra=IDLE, extra=NO_CACHE))
    got = read_stream(gw.base_url + "/chat/completions", "identity")
    data = [e for e in got.events if e.startswith(b"data: ")]
    assert data == [*FIRST, b"data: [DONE]\n\n"], got.body


# ---------------------------------------------------------------- cut before any event: HTTP 502


def sse_then(body: bytes, then: str) -> Handler:
    return raw_response(sse_head(), body, then)


BEFORE_FIRST_EVENT = {
    "reset after headers": (sse_then(b"", "reset"), 502, "upstream_error"),
    "reset in the first event": (
        sse_then(chunk(b'data: {"id": "x", "cho'), "reset"),
        502,
        "upstream_error",
    ),
    "clean end with no event": (sse_then(LAST_CHUNK, "close"), 502, "upstream_error"),
    "close after headers": (sse_then(b"", "close"), 502, "upstream_error"),
    "stall before the first event": (sse_then(b"", "stall"), 504, "upstream_timeout"),
    "not an event stream": (
        raw_response(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n",
            b"{}",
        ),
        502,
        "upstream_error",
    ),
}


@pytest.mark.parametrize("case", list(BEFORE_FIRST_EVENT))
@pytest.mark.parametrize("accept", ["identity", "gzip"])
def test_stream_cut_before_the_first_event_is_a_clean_http_error(gateway, upstream, case, accept):
    handler, status, type_ = BEFORE_FIRST_EVENT[case]
    up = upstream(handler)
    gw = gateway(config_for(up.url, backend_extra=IDLE, extra=NO_CACHE))
    resp = httpx2.post(
        gw.base_url + "/chat/completions", json=STREAM, headers={"accept-encoding": accept}
    )
    assert_openai_error(resp, status, type_)
    assert resp.headers["vary"] == "Accept-Encoding"


@pytest.mark.parametrize("case", list(BEFORE_FIRST_EVENT))
def test_sdk_gets_a_status_error_when_the_stream_is_cut_before_the_first_event(
    gateway, upstream, case
):
    handler, status, type_ = BEFORE_FIRST_EVENT[case]
    gw = gateway(config_for(upstream(handler).url, backend_extra=IDLE, extra=NO_CACHE))
    with sdk(gw) as client, pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert info.value.status_code == status
    assert info.value.body["type"] == type_


# ---------------------------------------------------------------- bad framing: 502 before any byte


def head(*lines: str) -> bytes:
    return ("\r\n".join(["HTTP/1.1 200 OK", *lines]) + "\r\n\r\n").encode()


CHAT_BODY = orjson.dumps(
    {
        "id": "chatcmpl-f",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
        ],
    }
)
SSE_BODY = chunk(FIRST[0] + FIRST[1] + b"data: [DONE]\n\n") + LAST_CHUNK
BIG_BODY = b'{"id": "chatcmpl-big", "pad": "' + b"p" * 20000 + b'"}'

#: name -> (stream?, upstream handler)
FRAMING = {
    "json: content-length and chunked": raw_response(
        head(
            "content-type: application/json",
            f"content-length: {len(CHAT_BODY)}",
            "transfer-encoding: chunked",
        ),
        chunk(CHAT_BODY) + LAST_CHUNK,
    ),
    "sse: content-length and chunked": raw_response(
        head(
            "content-type: text/event-stream",
            "content-length: 10",
            "transfer-encoding: chunked",
        ),
        SSE_BODY,
    ),
    "json: invalid content-length": raw_response(
        head("content-type: application/json", "content-length: abc"), CHAT_BODY
    ),
    "json: negative content-length": raw_response(
        head("content-type: application/json", "content-length: -5"), CHAT_BODY
    ),
    "json: two different content-lengths": raw_response(
        head(
            "content-type: application/json",
            f"content-length: {len(CHAT_BODY)}",
            f"content-length: {len(CHAT_BODY) + 10}",
        ),
        CHAT_BODY,
    ),
    "sse: invalid content-length": raw_response(
        head("content-type: text/event-stream", "content-length: 12x"), SSE_BODY
    ),
    "json: body shorter than content-length": raw_response(
        head("content-type: application/json", f"content-length: {len(BIG_BODY)}"),
        BIG_BODY[: len(BIG_BODY) // 2],
    ),
    "json: short body, then reset": raw_response(
        head("content-type: application/json", f"content-length: {len(BIG_BODY)}"),
        BIG_BODY[:5000],
        "reset",
    ),
    "json: truncated chunk": raw_response(
        head("content-type: application/json", "transfer-encoding: chunked"),
        b"4e20\r\n" + BIG_BODY[:3000],
    ),
    "json: chunked without the last chunk": raw_response(
        head("content-type: application/json", "transfer-encoding: chunked"), chunk(CHAT_BODY)
    ),
    "json: gzip body cut short (length right)": raw_response(
        head(
            "content-type: application/json",
            "content-encoding: gzip",
            f"content-length: {len(gzip.compress(BIG_BODY)) - 8}",
        ),
        gzip.compress(BIG_BODY)[:-8],
    ),
}


@pytest.mark.parametrize("case", list(FRAMING))
@pytest.mark.parametrize("accept", ["identity", "gzip"])
def test_bad_framing_is_502_before_any_byte(gateway, upstream, case, accept):
    up = upstream(FRAMING[case])
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    payload = STREAM if case.startswith("sse") else CHAT
    resp = httpx2.post(
        gw.base_url + "/chat/completions", json=payload, headers={"accept-encoding": accept}
    )
    # never a (truncated) 200: the error in the OpenAI shape
    assert_openai_error(resp, 502, "upstream_error")
    assert resp.headers["vary"] == "Accept-Encoding"


@pytest.mark.parametrize("case", list(FRAMING))
def test_sdk_gets_502_for_bad_framing(gateway, upstream, case):
    gw = gateway(config_for(upstream(FRAMING[case]).url, extra=NO_CACHE))
    with sdk(gw) as client, pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            stream=case.startswith("sse"),
        )
    assert info.value.status_code == 502
    assert info.value.body["type"] == "upstream_error"


# ---------------------------------------------------------------- the client goes away


@dataclass
class SlowStream:
    events_sent: int = 0
    closed_at: float | None = None
    finished: bool = False


def slow_stream(state: SlowStream, gap: float = 0.05, count: int = 200) -> Handler:
    """A live SSE upstream (one event per ``gap``) that notes when its connection dies."""

    async def handler(req: SeenRequest, writer: Any) -> bool:
        try:
            writer.write(sse_head())
            await writer.drain()
            for i in range(count):
                if writer.transport.is_closing():
                    raise ConnectionResetError("closed by the peer")
                writer.write(chunk(chat_chunk(f"w{i} ")))
                await writer.drain()
                state.events_sent += 1
                await asyncio.sleep(gap)
            writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
            await writer.drain()
            state.finished = True
        except (ConnectionError, OSError):
            state.closed_at = time.monotonic()
        return False

    return handler


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_client_disconnect_closes_the_upstream_connection(gateway, upstream, access_lines):
    state = SlowStream()
    up = upstream(slow_stream(state))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    body = orjson.dumps(STREAM)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\ncontent-type: application/json\r\n"
        b"accept-encoding: identity\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    try:
        sock.sendall(request)
        seen = b""
        while b"data: " not in seen or not seen.rstrip(b"\r\n").endswith(b"}"):
            data = sock.recv(65536)
            assert data, "the gateway closed the stream"
            seen += data
        assert seen.startswith(b"HTTP/1.1 200")
    finally:
        sock.close()
    closed_by_client = time.monotonic()
    # bounded wait on the fault: the upstream must see its connection go within a second
    assert wait_for(lambda: state.closed_at is not None, 2.0), state
    assert state.closed_at is not None
    assert state.closed_at - closed_by_client < 1.0, state.closed_at - closed_by_client
    assert not state.finished
    assert wait_for(lambda: up.closed_connections == up.connections == 1, 1.0)
    # SPEC §8: counted as 499
    assert wait_for(lambda: any(r["path"] == "/v1/chat/completions" for r in access_lines), 1.0)
    (line,) = [r for r in access_lines if r["path"] == "/v1/chat/completions"]
    assert line["status"] == 499, line


@pytest.mark.parametrize("compressed", [False, True])
def test_sdk_closing_a_stream_early_closes_the_upstream_connection(gateway, upstream, compressed):
    state = SlowStream()
    up = upstream(slow_stream(state))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    headers = {} if compressed else {"accept-encoding": "identity"}
    with sdk(gw) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            extra_headers=headers,
        )
        assert raw.headers.get("content-encoding", "identity") == (
            "br" if compressed else "identity"
        )
        stream = raw.parse()
        first = next(iter(stream))
        assert first.choices[0].delta.content == "w0 "
        stream.close()
        closed_by_client = time.monotonic()
    assert wait_for(lambda: state.closed_at is not None, 2.0), state
    assert state.closed_at is not None
    assert state.closed_at - closed_by_client < 1.0, state.closed_at - closed_by_client
    assert not state.finished


# ---------------------------------------------------------------- line endings


@pytest.mark.parametrize("eol", [b"\r", b"\r\n"], ids=["CR", "CRLF"])
def test_a_complete_stream_with_other_line_endings_is_not_cut(gateway, upstream, eol):
    """The event-stream format allows CR, LF and CRLF line ends: a complete stream whose lines
    end with CR only (its last CR arrives with the last read) is relayed whole, [DONE] included
    — it was cut as 'ended in the middle of an event'."""
    events = [*FIRST, b"data: [DONE]\n\n"]

    async def handler(req: SeenRequest, writer: Any) -> bool:
        body = b"".join(e.replace(b"\n", eol) for e in events)
        writer.write(sse_head() + chunk(body) + LAST_CHUNK)
        await writer.drain()
        return True

    up = upstream(handler)
    gw = gateway(config_for(up.url, backend_extra=IDLE, extra=NO_CACHE))
    text: list[str] = []
    with sdk(gw) as client:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        for c in stream:
            text.extend(ch.delta.content or "" for ch in c.choices)
    assert "".join(text) == "Hello world"
