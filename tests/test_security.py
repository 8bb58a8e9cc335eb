"""The proxy security suite over raw sockets (SPEC §5, §12): what a hostile client sends, and
what the upstream must never see.

Each case is a real request written byte for byte to the gateway's socket; the upstream is a
real server that records every request it receives, so "refused" means the upstream saw nothing.
The backend is configured with a base path (``/base/v1``) to prove no request leaves it.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import httpx2
import openai
import orjson
import pytest

from tests.otlp_receiver import OTLPReceiver
from tests.support import (
    LAST_CHUNK,
    GatewayServer,
    Process,
    ScriptedUpstream,
    SeenRequest,
    answering,
    chat_chunk,
    chunk,
    free_port,
    gateway_cli,
    gateway_config,
    http_response,
    sse_head,
)

CHAT = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


def config(url: str, trusted: str = '["127.0.0.1/32"]', extra: str = "") -> str:
    return f"""
[[backends]]
name = "up"
url = "{url}"
api_key_env = "TEST_BACKEND_KEY"

[[routes]]
models = ["*"]
backends = ["up"]

[edge]
trusted_proxies = {trusted}
{extra}
"""


@pytest.fixture
def up(upstream) -> ScriptedUpstream:
    return upstream(answering(CHAT))


@pytest.fixture
def gw(gateway, up) -> GatewayServer:
    return gateway(gateway_config(config(f"http://127.0.0.1:{up.port}/base/v1")))


def port_of(gw: GatewayServer) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def send_raw(gw: GatewayServer, data: bytes, wait: float = 3.0) -> bytes:
    """Write ``data`` and read until the gateway closes or answers one full response."""
    with socket.create_connection(("127.0.0.1", port_of(gw)), timeout=wait) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                got = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not got:
                break
            out += got
            head, sep, rest = out.partition(b"\r\n\r\n")
            m = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
            if sep and m and len(rest) >= int(m.group(1)):
                break
    return out


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def post(path: bytes, body: bytes, *headers: bytes) -> bytes:
    head = [b"POST " + path + b" HTTP/1.1", b"Host: gw", *headers]
    if not any(h.lower().startswith((b"content-length", b"transfer-encoding")) for h in headers):
        head.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


# ---------------------------------------------------------------- credentials


CREDENTIALS = [
    b"Authorization: Bearer sk-client-secret-1",
    b"api-key: sk-client-secret-2",
    b"x-api-key: sk-client-secret-3",
    b"Proxy-Authorization: Basic c2VjcmV0OnNlY3JldA==",
]


@pytest.mark.parametrize(
    "request_bytes",
    [
        post(b"/v1/chat/completions", BODY, *CREDENTIALS),
        post(b"/v1/embeddings", b'{"model":"m","input":"x"}', *CREDENTIALS),
        post(b"/v1/files", b"raw upload", *CREDENTIALS),  # passthrough, streamed body
        b"GET /v1/files/file-1 HTTP/1.1\r\nHost: gw\r\n" + b"\r\n".join(CREDENTIALS) + b"\r\n\r\n",
    ],
    ids=["chat", "embeddings", "passthrough-post", "passthrough-get"],
)
def test_no_client_credential_reaches_the_upstream(gw, up, request_bytes):
    answer = send_raw(gw, request_bytes)
    assert status(answer) == 200, answer[:300]
    (seen,) = up.requests
    names = seen.header_names()
    assert {"api-key", "x-api-key", "proxy-authorization"}.isdisjoint(names)
    assert seen.header("authorization") == "Bearer sk-backend-secret-for-tests"
    assert b"sk-client-secret" not in repr(seen.headers).encode()
    assert b"c2VjcmV0OnNlY3JldA" not in repr(seen.headers).encode()
    # and the upstream URL is the configured base path + the path after /v1
    assert seen.target.startswith("/base/v1/")


def test_host_is_the_backends_never_the_clients(gw, up):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nContent-Length: %d"
    answer = send_raw(gw, head % len(BODY) + b"\r\n\r\n" + BODY)
    assert status(answer) == 200
    assert up.requests[0].header("host") == f"127.0.0.1:{up.port}"


def test_absolute_form_targets_cannot_pick_the_upstream(gw, up):
    # RFC 9112 §3.2.2: absolute-form; the host in it must not steer the request anywhere
    answer = send_raw(gw, b"GET http://evil.example/v1/files HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert status(answer) == 200
    assert up.requests[0].target == "/base/v1/files"


@pytest.mark.parametrize(
    ("trusted", "kept"),
    [('["127.0.0.1/32"]', True), ("[]", False)],
    ids=["trusted-peer", "untrusted-peer"],
)
def test_x_forwarded_for_is_kept_only_from_a_trusted_proxy(gateway, up, trusted, kept):
    gw = gateway(gateway_config(config(up.url, trusted)))
    forged = b"X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: a"
    send_raw(gw, post(b"/v1/chat/completions", BODY, forged))
    seen = up.requests[0]
    xff = seen.header("x-forwarded-for")
    assert xff == ("203.0.113.9, 127.0.0.1" if kept else "127.0.0.1")
    assert (seen.header("x-forwarded-proto") == "https") is kept


# ---------------------------------------------------------------- the path stays under the base


REFUSED_PATHS = [
    b"/v1/../admin",
    b"/v1/./files",
    b"/v1/files/..",
    b"/v1/%2e%2e/admin",
    b"/v1/%2E%2E/admin",
    b"/v1/.%2e/admin",
    b"/v1/files/..%2f..%2fetc",
    b"/v1/files/%2F..%2Fadmin",
    b"/v1/files%5c..%5cadmin",
    b"/v1/files/..;/admin",  # path parameters: a servlet container strips ";..."
    b"/v1/files/%2e%2e;/admin",
    b"/v1/files/%252e%252e/admin",  # double encoding
    b"/v1/files/%00",
    b"/v1/files/%0d%0aX-Evil:%201",
    b"/v1/files/%23frag",
    b"/v1/files/%3fq=1",
    b"/v1/files\\..\\admin",
]


@pytest.mark.parametrize("path", REFUSED_PATHS, ids=[p.decode("latin-1") for p in REFUSED_PATHS])
def test_paths_that_could_leave_the_base_path_are_refused(gw, up, path):
    answer = send_raw(gw, b"GET " + path + b" HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert status(answer) == 400, answer[:300]
    if b"application/json" in answer:  # refused by the gateway, in the OpenAI shape
        assert b'"invalid_path"' in answer
    assert up.requests == []


@pytest.mark.parametrize(
    ("path", "forwarded"),
    [
        (b"/v1/files/file-abc/content", "/base/v1/files/file-abc/content"),
        (b"/v1/files/a%20b", "/base/v1/files/a%20b"),  # an escape a path needs is kept
        (b"/v1/@evil.example/x", "/base/v1/@evil.example/x"),  # "@" in a path is just a char
        # one spelling (docs/spec.md §25, §26): no trailing or repeated "/"
        (b"/v1/files/?purpose=batch", "/base/v1/files?purpose=batch"),
        (b"/v1//admin", "/base/v1/admin"),
        (
            b"/v1/fine-tuning/jobs/ftjob-1/events?limit=2",
            "/base/v1/fine-tuning/jobs/ftjob-1/events?limit=2",
        ),
    ],
)
def test_safe_paths_are_forwarded_under_the_base_path(gw, up, path, forwarded):
    answer = send_raw(gw, b"GET " + path + b" HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert status(answer) == 200, answer[:300]
    assert up.requests[0].target == forwarded


@pytest.mark.parametrize(
    "model",
    ["m\r\nX-Evil: 1", "m\nx", "m\x00", "m" * 300, ""],
    ids=["crlf", "lf", "nul", "too-long", "empty"],
)
def test_model_names_with_control_characters_are_refused(gw, up, model):
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    answer = send_raw(gw, post(b"/v1/chat/completions", body))
    assert status(answer) == 400
    assert b'"invalid_model"' in answer
    assert up.requests == []


# ---------------------------------------------------------------- request smuggling


SMUGGLING = {
    "cl-and-te": post(
        b"/v1/chat/completions",
        b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n",
        b"Content-Length: 4",
        b"Transfer-Encoding: chunked",
    ),
    "duplicate-cl": post(
        b"/v1/chat/completions", BODY, b"Content-Length: %d" % len(BODY), b"Content-Length: 5"
    ),
    "bad-chunk-size": post(
        b"/v1/chat/completions", b"zz\r\n" + BODY + b"\r\n0\r\n\r\n", b"Transfer-Encoding: chunked"
    ),
    "te-not-chunked-last": post(
        b"/v1/chat/completions", b"0\r\n\r\n", b"Transfer-Encoding: chunked, identity"
    ),
    "space-before-colon": post(
        b"/v1/chat/completions", BODY, b"Transfer-Encoding : chunked", b"Content-Length: 9"
    ),
    "lf-only-lines": b"POST /v1/files HTTP/1.1\nHost: gw\nContent-Length: 2\n\nab",
    "nul-in-header": post(b"/v1/files", b"ab", b"X-A: a\x00b"),
    "negative-cl": post(b"/v1/files", b"ab", b"Content-Length: -2"),
}


@pytest.mark.parametrize("raw", SMUGGLING.values(), ids=SMUGGLING.keys())
def test_smuggling_payloads_are_rejected_before_the_upstream(gw, up, raw):
    answer = send_raw(gw, raw)
    assert answer == b"" or status(answer) == 400, answer[:300]
    assert up.requests == []
    # the gateway is fine afterwards
    assert httpx2.get(gw.url + "/healthz").status_code == 200


def test_obs_fold_is_refused_or_forwarded_unfolded(gw, up):
    """RFC 9112 §5.2: a proxy rejects an obs-fold or replaces it with spaces before forwarding.
    The httptools tested newest (0.9) rejects it; 0.6.0, the lowest allowed, joins the lines —
    either way no line break reaches the upstream (where it would start a header of its own)."""
    answer = send_raw(gw, post(b"/v1/chat/completions", BODY, b"X-Folded: a", b" b"))
    if status(answer) == 400:
        assert up.requests == []
    else:
        assert status(answer) == 200
        # a raw continuation line would not parse upstream (tests.support.read_request)
        (seen,) = up.requests
        assert seen.header("x-folded") == "a b"


def test_a_body_over_the_limit_never_reaches_the_upstream(gateway, up):
    limits = "[server]\nmax_body_bytes = 1000\nmax_upload_bytes = 4000\n"
    gw = gateway(gateway_config(config(up.url) + limits))
    big = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 2000 + b'"}]}'
    assert status(send_raw(gw, post(b"/v1/chat/completions", big))) == 413
    assert status(send_raw(gw, post(b"/v1/audio/transcriptions", b"y" * 5000))) == 413
    # a file upload is bounded by max_upload_bytes instead (docs/spec.md §24)
    assert status(send_raw(gw, post(b"/v1/files", b"y" * 5000))) == 413
    assert up.requests == []


# ---------------------------------------------------------------- secrets never written out


BACKEND_SECRET = "sk-backend-secret-for-tests"  # tests/conftest.py sets TEST_BACKEND_KEY to it
CLIENT_KEY = "sk-client-secret-in-a-grep-7f3e"
PROMPT = "PROMPT-MARKER-d41d8cd9"


def failing_then_streaming(req: SeenRequest, state: dict[str, int]) -> bytes:
    state["n"] = state.get("n", 0) + 1
    if b"fail-500" in req.body:
        return http_response(500, b'{"error":{"message":"upstream broke","type":"server"}}')
    if b"retry-503" in req.body and state["n"] % 2 == 1:
        return http_response(503, b'{"error":{"message":"busy","type":"server"}}')
    if b'"stream":true' in req.body:
        events = [chunk(chat_chunk(w)) for w in ("a", "b")]
        return sse_head() + b"".join(events) + chunk(b"data: [DONE]\n\n") + LAST_CHUNK
    return http_response(200, CHAT)


@pytest.fixture
def grep_upstream(upstream) -> ScriptedUpstream:
    state: dict[str, int] = {}

    async def handler(req, writer):
        writer.write(failing_then_streaming(req, state))
        return True

    return upstream(handler)


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver("http") as r:
        yield r


def test_no_secret_and_no_prompt_in_anything_the_gateway_writes(tmp_path, grep_upstream, receiver):
    cfg = f"""
[[backends]]
name = "up"
url = "{grep_upstream.url}"
api_key_env = "TEST_BACKEND_KEY"
[[backends]]
name = "dead"
url = "http://127.0.0.1:9/v1"
api_key_env = "TEST_BACKEND_KEY"
[[routes]]
models = ["dead-*"]
backends = ["dead"]
retries = 1
[[routes]]
models = ["*"]
backends = ["up"]
[cache]
backend = "memory"
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
schedule_delay_ms = 50
[metrics]
enabled = true
[ui]
enabled = true
"""
    port = free_port()
    path = tmp_path / "gateway.toml"
    path.write_text(f'[server]\nport = {port}\n[logging]\naccess_log = "all"\n' + cfg)
    gw = Process(gateway_cli("serve", "-c", str(path)), port)
    try:
        base = f"http://127.0.0.1:{gw.port}/v1"
        client = openai.OpenAI(base_url=base, api_key=CLIENT_KEY, max_retries=0)
        msg = [{"role": "user", "content": PROMPT}]
        client.chat.completions.create(model="m", messages=msg, temperature=0)
        client.chat.completions.create(model="m", messages=msg, temperature=0)  # a cache hit
        list(client.chat.completions.create(model="m", messages=msg, stream=True))
        for content, error in (("fail-500", openai.InternalServerError), ("retry-503", None)):
            m = [{"role": "user", "content": f"{PROMPT} {content}"}]
            if error is None:
                client.chat.completions.create(model="m", messages=m)
            else:
                with pytest.raises(error):
                    client.chat.completions.create(model="m", messages=m)
        with pytest.raises(openai.APIStatusError):  # refused upstream: 502 after a retry
            client.chat.completions.create(model="dead-1", messages=msg)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m\r\nx", messages=msg)
        receiver.wait_for(lambda spans: len({s.trace_id for s in spans}) >= 7)
        served = [
            httpx2.get(f"http://127.0.0.1:{gw.port}{p}").text
            for p in ("/metrics", "/readyz", "/_gateway/api/requests", "/_gateway/api/backends")
        ]
    finally:
        output = gw.stop()
    assert "/v1/chat/completions" in output  # the access log is in what we read
    written = "\n".join([output, *served, receiver.dump(), *map(repr, receiver.spans)])
    for secret in (BACKEND_SECRET, CLIENT_KEY, PROMPT):
        assert secret not in written, f"{secret} was written out"


# ---------------------------------------------------------------- header limits


@pytest.mark.parametrize(
    ("head", "want"),
    [
        (b"X-Big: " + b"a" * 70_000, 431),  # over 64 KiB of head
        (b"\r\n".join(b"X-H%d: v" % i for i in range(101)), 431),  # over 100 headers
        (b"X-Pad-" + b"p" * 40_000 + b": v\r\nX-More: " + b"m" * 30_000, 431),  # names count too
    ],
    ids=["one-huge-header", "too-many-headers", "big-name-and-value"],
)
def test_oversized_heads_get_431_and_never_reach_the_upstream(gw, up, head, want):
    answer = send_raw(gw, b"GET /v1/files HTTP/1.1\r\nHost: gw\r\n" + head + b"\r\n\r\n")
    assert status(answer) == want
    assert b'"request_header_fields_too_large"' in answer and b"connection: close" in answer
    assert up.requests == []
    # just under the limits is fine
    fine = b"\r\n".join(b"X-H%d: v" % i for i in range(90))
    assert (
        status(send_raw(gw, b"GET /v1/files HTTP/1.1\r\nHost: gw\r\n" + fine + b"\r\n\r\n")) == 200
    )


def test_an_overlong_request_target_gets_414(gw, up):
    answer = send_raw(gw, b"GET /v1/files/" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert status(answer) == 414
    assert up.requests == []
