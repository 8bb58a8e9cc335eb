"""SPEC §9 Content-Encoding over real sockets: the gateway and its upstreams as loopback servers.

Clients here send an explicit ``Accept-Encoding`` (or none) and read the *raw* bytes
(``http.client`` and httpx2's ``iter_raw`` never decode), then decode them with the reference
libraries, so a wrong header, a double encoding or a buffered stream shows as a failure.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import os
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import brotli
import httpx2
import orjson
import pytest
import zstandard

from gateway.encoding import negotiate
from tests.support import (
    LAST_CHUNK,
    WORDS,
    GatewayServer,
    SeenRequest,
    chat_chunk,
    chunk,
    config_for,
    http_response,
    openai_client,
    paced_upstream,
    sse_head,
)

NO_CACHE = '[cache]\nbackend = "off"'
#: ~30 KB of JSON (the mock's default 1536 dimensions as floats): big enough to be compressed
EMBED = {
    "model": "text-embedding-3-small",
    "input": "the quick brown fox",
    "encoding_format": "float",
}
#: the same answer shape, under 1 KiB
SMALL_EMBED = {**EMBED, "dimensions": 4}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-enc",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


# ---------------------------------------------------------------- raw HTTP client


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes  # exactly as received (content-coded, de-chunked)

    def header(self, name: str) -> str | None:
        values = self.all(name)
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def json(self) -> Any:
        return orjson.loads(self.body)


def request(
    port: int,
    path: str,
    body: bytes | None = None,
    *,
    accept: str | None = None,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> Answer:
    """One request on a fresh connection; ``accept=None`` sends no Accept-Encoding at all;
    ``chunked`` sends the body in 8 KiB chunks without a Content-Length."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        if accept is not None:
            conn.putheader("Accept-Encoding", accept)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Type", "application/json")
        if body is not None and chunked:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for i in range(0, len(body), 8192):
                part = body[i : i + 8192]
                conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()  # de-chunks, never decodes
        return Answer(resp.status, resp.getheaders(), data)
    finally:
        conn.close()


def post(port: int, path: str, obj: Any, accept: str | None = None, **kw: Any) -> Answer:
    return request(port, path, orjson.dumps(obj), accept=accept, **kw)


def decode(coding: str | None, data: bytes) -> bytes:
    """Decode a whole body with the reference library of its coding."""
    if coding is None or coding == "identity":
        return data
    if coding == "br":
        return brotli.decompress(data)
    if coding == "gzip":
        return gzip.decompress(data)
    if coding == "zstd":
        out = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        return out
    raise AssertionError(f"unexpected coding {coding!r}")


def assert_openai_error(ans: Answer, status: int, type_: str) -> dict[str, Any]:
    assert ans.status == status, ans.body
    assert ans.header("content-type") == "application/json"
    assert ans.header("content-encoding") is None  # error bodies are tiny: identity
    body = ans.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert err["type"] == type_ and err["param"] is None
    assert isinstance(err["message"], str) and err["message"]
    return err


def assert_vary(ans: Answer) -> None:
    """``Vary`` names Accept-Encoding exactly once (other names, e.g. an upstream's, may join)."""
    names = [n.strip().lower() for v in ans.all("vary") for n in v.split(",")]
    assert names.count("accept-encoding") == 1, ans.headers


def port_of(server: Any) -> int:
    return int(server.port)


# ---------------------------------------------------------------- scripted upstreams


def answering(body: bytes = CHAT_ANSWER, extra: list[tuple[str, str]] | None = None):
    async def handler(req: SeenRequest, writer: Any) -> bool:
        writer.write(http_response(200, body, extra=extra))
        return True

    return handler


@pytest.fixture(scope="module")
def mock_gw(mock_upstream) -> Iterator[GatewayServer]:
    """The gateway over the mock upstream process, cache off (every request goes upstream);
    shared by the module's read-only negotiation cases and stopped by its own handle."""
    server = GatewayServer(config_for(mock_upstream.url + "/v1", extra=NO_CACHE)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(mock_upstream) -> bytes:
    """The embeddings answer as the upstream itself sends it (identity)."""
    resp = httpx2.post(
        mock_upstream.url + "/v1/embeddings", json=EMBED, headers={"accept-encoding": "identity"}
    )
    assert resp.status_code == 200
    assert "content-encoding" not in resp.headers
    assert len(resp.content) > 20_000  # the premise: a body worth compressing
    return resp.content


# ---------------------------------------------------------------- response negotiation


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        # no header / empty header / identity only: identity
        (None, "identity"),
        ("", "identity"),
        ("identity", "identity"),
        ("deflate", "identity"),  # a coding we do not produce: identity stays the fallback
        # one coding
        ("br", "br"),
        ("zstd", "zstd"),
        ("gzip", "gzip"),
        ("x-gzip", "gzip"),
        ("GZIP", "gzip"),
        # server preference among equal q: br > zstd > gzip
        ("gzip, deflate, br, zstd", "br"),
        ("gzip, zstd", "zstd"),
        ("zstd, br", "br"),
        ("br;q=0.5, zstd;q=0.5, gzip;q=0.5", "br"),
        ("gzip;q=0.5, zstd;q=0.5", "zstd"),
        # q ordering beats the preference
        ("br;q=0.5, gzip;q=0.8", "gzip"),
        ("br;q=0.8, zstd;q=0.9, gzip;q=0.7", "zstd"),
        ("gzip;q=1.0, br;q=0.999", "gzip"),
        ("identity, gzip;q=0.9", "identity"),
        ("gzip;q=0.5", "gzip"),  # a listed coding beats the implicit identity
        # *
        ("*", "br"),
        ("*, br;q=0", "zstd"),
        ("*, br;q=0, zstd;q=0", "gzip"),
        ("*, br;q=0, zstd;q=0, gzip;q=0", "identity"),
        ("*;q=0, gzip", "gzip"),
        ("*;q=0.5, identity;q=0.6", "identity"),
        ("*;q=0.1, identity;q=0", "br"),
        # identity refused: some coding must be used
        ("identity;q=0, gzip", "gzip"),
        ("br;q=0.001, identity;q=0", "br"),
        # an explicit refusal of a coding
        ("br;q=0", "identity"),
        ("gzip, gzip;q=0", "identity"),
    ],
)
def test_response_coding_follows_accept_encoding(mock_gw, reference, accept, expected):
    ans = post(port_of(mock_gw), "/v1/embeddings", EMBED, accept)
    assert ans.status == 200, ans.body
    assert_vary(ans)
    coding = ans.header("content-encoding")
    assert (coding or "identity") == expected, ans.headers
    assert ans.header("content-length") == str(len(ans.body))
    if expected != "identity":
        assert len(ans.body) < len(reference) // 2  # it really is compressed
    assert decode(coding, ans.body) == reference


@pytest.mark.parametrize(
    "accept",
    [
        "*;q=0",
        "identity;q=0",
        "identity;q=0, deflate",
        "br;q=0, zstd;q=0, gzip;q=0, identity;q=0",
        "deflate, *;q=0",
        "identity;q=0, *;q=0",
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_406_when_no_coding_is_acceptable(gateway, upstream, accept, stream):
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    ans = post(port_of(gw), "/v1/chat/completions", {**CHAT, "stream": stream}, accept)
    err = assert_openai_error(ans, 406, "not_acceptable")
    assert err["code"] == "no_acceptable_encoding"
    assert_vary(ans)
    assert ans.header("x-request-id")
    assert up.requests == []  # refused before any upstream work


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("br", "identity"),
        ("gzip, deflate, br, zstd", "identity"),
        ("*", "identity"),
        # identity refused: even a tiny body is encoded
        ("gzip, identity;q=0", "gzip"),
        ("br, *;q=0", "br"),
        ("zstd;q=0.5, identity;q=0", "zstd"),
    ],
)
def test_bodies_under_1_kib_stay_identity_unless_identity_is_refused(mock_gw, accept, expected):
    plain = post(port_of(mock_gw), "/v1/embeddings", SMALL_EMBED)
    assert plain.status == 200 and len(plain.body) < 1024
    ans = post(port_of(mock_gw), "/v1/embeddings", SMALL_EMBED, accept)
    assert ans.status == 200
    assert_vary(ans)
    assert (ans.header("content-encoding") or "identity") == expected
    assert decode(ans.header("content-encoding"), ans.body) == plain.body


def test_cache_hits_are_negotiated_per_request(gateway, mock_upstream, reference):
    """A cached answer is stored decoded and encoded for each client anew (never twice); the
    second round gets the compressed forms the first one made (the entry keeps them)."""
    gw = gateway(config_for(mock_upstream.url + "/v1"))  # memory cache on
    first = post(port_of(gw), "/v1/embeddings", EMBED, "br")
    assert first.status == 200 and first.header("x-gateway-cache") == "MISS"
    codings = [("gzip", "gzip"), ("zstd", "zstd"), (None, None), ("br", "br")]
    for accept, expected in codings * 2:
        hit = post(port_of(gw), "/v1/embeddings", EMBED, accept)
        assert hit.status == 200
        assert hit.header("x-gateway-cache") == "HIT"
        assert hit.header("content-encoding") == expected
        assert_vary(hit)
        assert decode(expected, hit.body) == reference


# ---------------------------------------------------------------- Vary on every answer


def test_vary_on_every_model_call_answer_errors_included(gateway, upstream):
    async def handler(req: SeenRequest, writer: Any) -> bool:
        model = orjson.loads(req.body)["model"]
        if model == "bad":
            writer.write(http_response(400, b'{"error": {"message": "no", "type": "x"}}'))
        elif model == "reset":
            writer.transport.abort()
            return False
        elif model == "stream":
            writer.write(sse_head() + chunk(chat_chunk("a")) + chunk(b"data: [DONE]\n\n"))
            writer.write(LAST_CHUNK)
        else:
            writer.write(http_response(200, CHAT_ANSWER, extra=[("vary", "Origin")]))
        return True

    up = upstream(handler)
    gw = gateway(config_for(up.url, extra=NO_CACHE + "\n[server]\nmax_body_bytes = 4096"))
    port = port_of(gw)
    path = "/v1/chat/completions"
    answers = {
        200: post(port, path, CHAT, "br"),
        "stream": post(port, path, {**CHAT, "model": "stream", "stream": True}, "gzip"),
        "upstream 400": post(port, path, {**CHAT, "model": "bad"}, "br"),
        502: post(port, path, {**CHAT, "model": "reset"}, "br"),
        400: request(port, path, b"not json", accept="br"),
        413: request(port, path, b"{" + b" " * 8000 + b"}", accept="br"),
        415: request(port, path, b"x", accept="br", headers={"Content-Encoding": "deflate"}),
        406: post(port, path, CHAT, "*;q=0"),
    }
    for what, ans in answers.items():
        assert_vary(ans)
        if isinstance(what, int):
            assert ans.status == what, (what, ans.body)
    assert answers["stream"].header("content-encoding") == "gzip"
    assert answers["upstream 400"].status == 400


def test_vary_on_the_gateways_own_answers(gateway, upstream):
    """SPEC §9 says ``Vary: Accept-Encoding`` always: /v1/models and the unknown-path 404 too."""
    up = upstream(answering(b'{"object": "list", "data": []}'))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    port = port_of(gw)
    models = request(port, "/v1/models", method="GET", accept="br")
    assert models.status == 200
    missing = request(port, "/nope", method="GET", accept="br")
    assert missing.status == 404
    problems = [
        (path, ans.all("vary"))
        for path, ans in [("/v1/models", models), ("/nope", missing)]
        if "accept-encoding" not in ", ".join(ans.all("vary")).lower()
    ]
    assert not problems, f"answers without Vary: Accept-Encoding: {problems}"


# ---------------------------------------------------------------- nothing is encoded twice


def big_json() -> bytes:
    vector = [round((i * 7919 % 2000) / 1000 - 1, 6) for i in range(3000)]
    return orjson.dumps(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "model": "e",
            "usage": {"prompt_tokens": 3, "total_tokens": 3},
        }
    )


BIG = big_json()
#: gzip level 9 with a fixed mtime: bytes the gateway would never produce itself (it uses 4)
BIG_GZIP = gzip.compress(BIG, compresslevel=9, mtime=0)
SMALL = CHAT_ANSWER
SMALL_GZIP = gzip.compress(SMALL, compresslevel=9, mtime=0)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("gzip", "gzip"),  # accepted: passed through byte for byte
        ("gzip, br", "gzip"),  # br is preferred, but gzip is accepted: never decode + re-encode
        ("*", "gzip"),
        ("br", "br"),  # not accepted: decoded and re-encoded
        ("gzip;q=0, br", "br"),
        ("zstd, identity;q=0", "zstd"),
        (None, "identity"),
        ("identity", "identity"),
    ],
)
def test_upstream_gzip_is_passed_through_or_recoded_never_twice(
    gateway, upstream, accept, expected
):
    assert gzip.compress(BIG, 4, mtime=0) != BIG_GZIP
    up = upstream(answering(BIG_GZIP, extra=[("content-encoding", "gzip")]))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    ans = post(port_of(gw), "/v1/chat/completions", CHAT, accept)
    assert ans.status == 200
    assert_vary(ans)
    coding = ans.header("content-encoding")
    assert (coding or "identity") == expected, ans.headers
    assert ans.all("content-encoding") == ([] if coding is None else [coding])
    assert ans.header("content-length") == str(len(ans.body))
    if expected == "gzip":
        assert ans.body == BIG_GZIP  # the upstream's exact bytes
    assert decode(coding, ans.body) == BIG


@pytest.mark.parametrize(
    ("accept", "expected"), [("gzip", "gzip"), ("br", "identity"), (None, "identity")]
)
def test_small_upstream_gzip_body(gateway, upstream, accept, expected):
    up = upstream(answering(SMALL_GZIP, extra=[("content-encoding", "gzip")]))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    ans = post(port_of(gw), "/v1/chat/completions", CHAT, accept)
    assert ans.status == 200
    assert (ans.header("content-encoding") or "identity") == expected
    if expected == "gzip":
        assert ans.body == SMALL_GZIP
    assert decode(ans.header("content-encoding"), ans.body) == SMALL


def test_large_upstream_gzip_body_is_decoded_for_a_client_that_refuses_gzip(gateway, upstream):
    """Bodies past the relay's hold limit (8 MiB) stream on; SPEC §9 still holds for them: an
    upstream coding the client does not accept is decoded, never handed over as it is."""
    plain = b'{"id": "chatcmpl-big", "pad": "' + base64.b64encode(os.urandom(9_000_000)) + b'"}'
    coded = gzip.compress(plain, 1)
    assert len(coded) > 8 * 1024 * 1024  # the premise: past HOLD_LIMIT even compressed
    up = upstream(answering(coded, extra=[("content-encoding", "gzip")]))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    accepted = post(port_of(gw), "/v1/chat/completions", CHAT, "gzip")
    assert accepted.status == 200
    assert accepted.header("content-encoding") == "gzip" and accepted.body == coded
    refused = post(port_of(gw), "/v1/chat/completions", CHAT, "identity")
    assert refused.status == 200
    assert refused.header("content-encoding") is None, (
        "a client that accepts only identity got the upstream's gzip body"
    )
    assert refused.body == plain


def test_passthrough_request_body_keeps_its_coding(gateway, upstream):
    """Other /v1/* paths forward the body unchanged (SPEC §5): a gzip body must reach the
    upstream either decoded, or still coded *with* its Content-Encoding; never coded bytes
    that no header describes."""
    up = upstream(answering(b'{"ok": true}'))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    plain = b'{"purpose": "batch", "file": "x"}'
    coded = gzip.compress(plain)
    ans = request(port_of(gw), "/v1/files", coded, headers={"Content-Encoding": "gzip"})
    assert ans.status == 200
    (seen,) = up.requests
    forwarded = (seen.header("content-encoding"), seen.body)
    assert forwarded in [(None, plain), ("gzip", coded)], (
        f"upstream got content-encoding={forwarded[0]!r} with body {forwarded[1][:12]!r}"
    )


STREAM_EVENTS = [chat_chunk(w) for w in ["Hello", ",", " gzip", " world"]] + [
    chat_chunk(None, finish="stop"),
    b"data: [DONE]\n\n",
]


def gzip_stream_upstream():
    """An SSE upstream whose body is gzip, flushed after every event (as a good server does)."""

    async def handler(req: SeenRequest, writer: Any) -> bool:
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        writer.write(sse_head([("content-encoding", "gzip")]))
        for event in STREAM_EVENTS:
            writer.write(chunk(z.compress(event) + z.flush(zlib.Z_SYNC_FLUSH)))
            await writer.drain()
        writer.write(chunk(z.flush(zlib.Z_FINISH)) + LAST_CHUNK)
        return True

    return handler


@pytest.mark.parametrize(
    ("accept", "expected"),
    [("gzip", "gzip"), ("br", "br"), ("zstd", "zstd"), (None, None), ("identity", None)],
)
def test_upstream_gzip_stream_is_decoded_and_encoded_for_the_client(
    gateway, upstream, accept, expected
):
    up = upstream(gzip_stream_upstream())
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    ans = post(port_of(gw), "/v1/chat/completions", {**CHAT, "stream": True}, accept)
    assert ans.status == 200
    assert ans.header("content-type") == "text/event-stream"
    assert ans.header("content-encoding") == expected
    assert_vary(ans)
    assert decode(expected, ans.body) == b"".join(STREAM_EVENTS)


# ---------------------------------------------------------------- what the gateway asks upstream


def test_gateway_asks_upstream_for_compression_on_json_requests(gateway, upstream):
    """SPEC §9: "the gateway asks upstreams for compressed responses"; the client's own
    Accept-Encoding is the client's business and is not forwarded."""
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    ans = post(port_of(gw), "/v1/chat/completions", CHAT, "identity")
    assert ans.status == 200
    (seen,) = up.requests
    asked = seen.header("accept-encoding")
    assert asked is not None, f"no Accept-Encoding sent upstream; headers: {seen.headers}"
    assert asked != "identity"
    assert negotiate(asked.encode()) in ("br", "zstd", "gzip"), asked


def test_what_the_gateway_asks_upstream_on_stream_requests(gateway, upstream):
    """Whatever a stream request asks upstream, it is not the client's header, and every
    coding it allows is one the gateway decodes as it streams."""
    up = upstream(gzip_stream_upstream())
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    client_accept = "br;q=0.9, snappy"
    ans = post(port_of(gw), "/v1/chat/completions", {**CHAT, "stream": True}, client_accept)
    assert ans.status == 200
    (seen,) = up.requests
    asked = seen.header("accept-encoding")
    assert asked != client_accept
    # (today the gateway sends no Accept-Encoding upstream at all, for streams as for JSON)
    for element in (asked or "").split(","):
        name, _, params = element.partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                q = float(value)
        if name.strip() and q > 0:
            assert name.strip().lower() in ("br", "zstd", "gzip", "x-gzip", "deflate", "identity")
    # and a coded upstream stream is decoded for this client (br), event for event
    assert ans.header("content-encoding") == "br"
    assert decode("br", ans.body) == b"".join(STREAM_EVENTS)


# ---------------------------------------------------------------- compressed streams, live


class Incremental:
    """A reference incremental decompressor per coding, plus an end-of-stream check."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        if coding == "br":
            self._br = brotli.Decompressor()
        elif coding == "gzip":
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            self._zs = zstandard.ZstdDecompressor().decompressobj()

    def feed(self, data: bytes) -> bytes:
        if self.coding == "br":
            out: bytes = self._br.process(data)
            return out
        if self.coding == "gzip":
            return self._z.decompress(data)
        return self._zs.decompress(data)

    def finished(self) -> bool:
        if self.coding == "br":
            return bool(self._br.is_finished())
        if self.coding == "gzip":
            return self._z.eof
        return bool(self._zs.eof)


def read_events_live(
    url: str, payload: dict[str, Any], coding: str
) -> tuple[list[bytes], list[float], Incremental, httpx2.Headers]:
    """POST, then read raw chunks as they arrive, decoding each at once; returns every
    complete event with the time its bytes became decodable."""
    dec = Incremental(coding)
    events: list[bytes] = []
    times: list[float] = []
    buf = b""
    with (
        httpx2.Client(timeout=20) as client,
        client.stream("POST", url, json=payload, headers={"accept-encoding": coding}) as resp,
    ):
        assert resp.status_code == 200
        headers = resp.headers
        for raw in resp.iter_raw():
            buf += dec.feed(raw)
            now = time.monotonic()
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                events.append(event + b"\n\n")
                times.append(now)
    assert buf == b""
    return events, times, dec, headers


@pytest.mark.parametrize("coding", ["br", "gzip", "zstd"])
def test_compressed_stream_decodes_event_by_event_as_the_upstream_sends(gateway, upstream, coding):
    sent_at: list[float] = []
    up = upstream(paced_upstream(sent_at))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    events, received_at, dec, headers = read_events_live(
        gw.base_url + "/chat/completions", {**CHAT, "stream": True}, coding
    )
    assert headers["content-encoding"] == coding
    assert headers["vary"] == "Accept-Encoding"
    assert "content-length" not in headers
    assert dec.finished()  # the coded stream was properly ended
    expected = [chat_chunk(w) for w in WORDS] + [
        chat_chunk(None, finish="stop"),
        b"data: [DONE]\n\n",
    ]
    assert events == expected
    # event i could be decoded on the client before the upstream had sent event i+1
    for i in range(len(WORDS)):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


def test_openai_sdk_streams_through_compression(gateway, upstream):
    sent_at: list[float] = []
    up = upstream(paced_upstream(sent_at))
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    client = openai_client(gw.base_url)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "go"}], stream=True
        )
        # the SDK's httpx2 offers its own codings (gzip, deflate, br): the gateway picks br
        assert raw.http_request.headers["accept-encoding"]
        assert raw.headers["content-encoding"] == negotiate(
            raw.http_request.headers["accept-encoding"].encode()
        )
        assert raw.headers["content-encoding"] != "identity"
        received_at: list[float] = []
        text = []
        for c in raw.parse():
            received_at.append(time.monotonic())
            if c.choices and c.choices[0].delta.content:
                text.append(c.choices[0].delta.content)
    finally:
        client.close()
    assert "".join(text) == "".join(WORDS)
    assert len(received_at) == len(WORDS) + 1
    for i in range(len(WORDS)):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


# ---------------------------------------------------------------- request bodies


def zstd_compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


REQUEST_CODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "br": brotli.compress,
    "zstd": zstd_compress,
    "ZSTD": zstd_compress,
    "gzip, br": lambda b: brotli.compress(gzip.compress(b)),
    "zstd, gzip": lambda b: gzip.compress(zstd_compress(b)),
    "identity": lambda b: b,
}


@pytest.mark.parametrize("coding", list(REQUEST_CODERS))
@pytest.mark.parametrize("stream", [False, True])
def test_compressed_request_bodies_reach_the_upstream_decoded(gateway, upstream, coding, stream):
    async def handler(req: SeenRequest, writer: Any) -> bool:
        if orjson.loads(req.body).get("stream"):
            writer.write(sse_head() + chunk(chat_chunk("ok") + b"data: [DONE]\n\n") + LAST_CHUNK)
        else:
            writer.write(http_response(200, CHAT_ANSWER))
        return True

    up = upstream(handler)
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    plain = orjson.dumps(
        {**CHAT, "stream": stream, "messages": [{"role": "user", "content": "z" * 3000}]}
    )
    coded = REQUEST_CODERS[coding](plain)
    ans = request(port_of(gw), "/v1/chat/completions", coded, headers={"Content-Encoding": coding})
    assert ans.status == 200, ans.body
    (seen,) = up.requests
    assert seen.body == plain
    assert "content-encoding" not in seen.header_names()
    assert seen.header("content-length") == str(len(plain))


@pytest.mark.parametrize("coding", ["deflate", "compress", "snappy", "gzip, deflate", "lz4"])
def test_unsupported_request_coding_is_415(gateway, upstream, coding):
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    body = zlib.compress(orjson.dumps(CHAT))
    ans = request(port_of(gw), "/v1/chat/completions", body, headers={"Content-Encoding": coding})
    err = assert_openai_error(ans, 415, "unsupported_media_type")
    assert err["code"] == "unsupported_content_encoding"
    assert coding in err["message"]
    assert_vary(ans)
    assert up.requests == []


CORRUPT = {
    "gzip garbage": ("gzip", b"\x1f\x8b\x08\x00" + b"\xff" * 40),
    "gzip not gzip": ("gzip", orjson.dumps(CHAT)),
    "gzip truncated": ("gzip", gzip.compress(orjson.dumps(CHAT))[:-6]),
    "br garbage": ("br", b"\xff" * 40 + b"not brotli"),
    "br truncated": ("br", brotli.compress(orjson.dumps(CHAT) * 20)[:-3]),
    "zstd garbage": ("zstd", b"\x28\xb5\x2f\xfd" + b"\xff" * 40),
    "zstd truncated": ("zstd", zstd_compress(orjson.dumps(CHAT) * 20)[:-3]),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_request_body_is_400(gateway, upstream, case):
    coding, body = CORRUPT[case]
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=NO_CACHE))
    ans = request(port_of(gw), "/v1/chat/completions", body, headers={"Content-Encoding": coding})
    err = assert_openai_error(ans, 400, "invalid_request_error")
    assert err["code"] == "invalid_content_encoding"
    assert_vary(ans)
    assert up.requests == []


LIMIT = 1 << 20
BOMB_SIZE = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """50 MB of zeros in each coding (a few KB to ~50 KB on the wire)."""
    zeros = bytes(BOMB_SIZE)
    out = {
        "gzip": gzip.compress(zeros, 9),
        "br": brotli.compress(zeros, quality=5),
        "zstd": zstandard.ZstdCompressor(level=3).compress(zeros),
    }
    del zeros
    return out


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_decompression_bomb_is_413_in_bounded_memory(gateway, upstream, bombs, coding, chunked):
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=f"{NO_CACHE}\n[server]\nmax_body_bytes = {LIMIT}"))
    body = bombs[coding]
    assert len(body) < 100_000
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        ans = request(
            port_of(gw),
            "/v1/chat/completions",
            body,
            headers={"Content-Encoding": coding},
            chunked=chunked,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = assert_openai_error(ans, 413, "payload_too_large")
    assert err["code"] == "body_too_large"
    assert str(LIMIT) in err["message"]
    assert_vary(ans)
    assert up.requests == []
    # the whole process (gateway thread included) never held anything like the 50 MB
    assert peak < 16 * 1024 * 1024, f"peak traced memory {peak / 1e6:.1f} MB"


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_compressed_body_is_limited_after_decoding(gateway, upstream, coding):
    """Exactly max_body_bytes decoded is accepted; one byte more is 413 (SPEC §4/§9)."""
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=f"{NO_CACHE}\n[server]\nmax_body_bytes = {LIMIT}"))
    prefix = b'{"model": "m", "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    at_limit = prefix + b"y" * (LIMIT - len(prefix) - len(suffix)) + suffix
    over = prefix + b"y" * (LIMIT + 1 - len(prefix) - len(suffix)) + suffix
    encode = REQUEST_CODERS[coding]
    ok = request(
        port_of(gw), "/v1/chat/completions", encode(at_limit), headers={"Content-Encoding": coding}
    )
    assert ok.status == 200, ok.body
    assert up.requests[0].body == at_limit
    too_big = request(
        port_of(gw), "/v1/chat/completions", encode(over), headers={"Content-Encoding": coding}
    )
    assert_openai_error(too_big, 413, "payload_too_large")
    assert len(up.requests) == 1


def test_concurrent_bombs_do_not_disturb_a_normal_request(gateway, upstream, bombs):
    """While bombs are refused, an ordinary request on another connection is answered."""
    up = upstream(answering())
    gw = gateway(config_for(up.url, extra=f"{NO_CACHE}\n[server]\nmax_body_bytes = {LIMIT}"))
    statuses: list[int] = []
    lock = threading.Lock()

    def bomb(coding: str) -> None:
        ans = request(
            port_of(gw), "/v1/chat/completions", bombs[coding], headers={"Content-Encoding": coding}
        )
        with lock:
            statuses.append(ans.status)

    threads = [threading.Thread(target=bomb, args=(c,)) for c in ["gzip", "br", "zstd"] * 2]
    for t in threads:
        t.start()
    normal = post(port_of(gw), "/v1/chat/completions", CHAT)
    for t in threads:
        t.join(30)
    assert normal.status == 200
    assert sorted(statuses) == [413] * 6
