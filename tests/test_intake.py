"""The server's rules on a request head (docs/spec.md §25, gateway/server/intake.py), over real
sockets: the canonical target in several spellings per class, a head that never ends, Host,
TRACE, and the lingering close after an early answer.

The upstream is a real server that records every request it receives (its base path is
``/base/v1``), so "refused" means it saw nothing and "canonical" means it saw exactly that.
"""

from __future__ import annotations

import asyncio
import socket
import time

import orjson
import pytest

from tests.support import (
    GatewayServer,
    ScriptedUpstream,
    SeenRequest,
    gateway_config,
    http_response,
)
from tests.test_security import BODY, CHAT, config, port_of, post, send_raw, status


@pytest.fixture
def up(upstream) -> ScriptedUpstream:
    async def reflect(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        """Answers a chat completion; anything else gets its own request back (a TRACE-style
        reflection: what a misbehaving upstream would echo, the backend's key included)."""
        if req.target.endswith("/chat/completions"):
            writer.write(http_response(200, CHAT))
        else:
            echo = orjson.dumps({"target": req.target, "headers": req.headers})
            writer.write(http_response(200, echo))
        return True

    return upstream(reflect)


@pytest.fixture
def gw(gateway, up) -> GatewayServer:
    return gateway(gateway_config(config(f"http://127.0.0.1:{up.port}/base/v1")))


def get(path: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([b"GET " + path + b" HTTP/1.1", b"Host: gw", *headers]) + b"\r\n\r\n"


# ---------------------------------------------------------------- one canonical target


@pytest.mark.parametrize(
    ("sent", "canonical"),
    [
        # percent-encoded unreserved characters are the characters (RFC 3986 §6.2.2.2)
        (b"/v1/responses/%72esp_abc", "/v1/responses/resp_abc"),
        (b"/v1/responses/%72%65%73%70_abc", "/v1/responses/resp_abc"),
        (b"/v1/files/file%2Dx%7e", "/v1/files/file-x~"),
        (b"/v1/%66iles/file-x", "/v1/files/file-x"),
        # sub-delims, ":" and "@" are written as they are
        (b"/v1/models/ft%3Agpt-4o%3aorg", "/v1/models/ft:gpt-4o:org"),
        # other escapes stay, upper-cased (mixed-case hex is one spelling)
        (b"/v1/files/a%c3%a9", "/v1/files/a%C3%A9"),
        (b"/v1/files/a%C3%a9", "/v1/files/a%C3%A9"),
        (b"/v1/files/a%20b", "/v1/files/a%20b"),
        # one spelling of slashes
        (b"/v1//files", "/v1/files"),
        (b"/v1/files/", "/v1/files"),
        (b"//v1///files//file-x//", "/v1/files/file-x"),
        (b"/v1/files/?limit=2", "/v1/files?limit=2"),
        # dots inside a segment are data
        (b"/v1/files/a..b", "/v1/files/a..b"),
        (b"/v1/files/...", "/v1/files/..."),
    ],
)
def test_the_upstream_gets_the_canonical_target(gw, up, sent, canonical):
    answer = send_raw(gw, get(sent))
    assert status(answer) == 200, answer[:300]
    (seen,) = up.requests
    assert seen.target == "/base" + canonical


@pytest.mark.parametrize(
    "sent",
    [
        b"/v1/chat/completions/",
        b"/v1//chat/completions",
        b"/v1/chat/%63ompletions",
        b"/v1/chat/completions",
    ],
)
def test_a_model_call_is_routed_by_its_canonical_path(gw, up, sent):
    answer = send_raw(gw, post(sent, BODY))
    assert status(answer) == 200, answer[:300]
    (seen,) = up.requests
    assert seen.target == "/base/v1/chat/completions"
    assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["object"] == "chat.completion"


@pytest.mark.parametrize(
    "sent",
    [
        # dot segments in every spelling, path parameters
        b"/v1/%2e%2e/admin",
        b"/v1/%2E./admin",
        b"/v1/.%2e/admin",
        b"/v1/files/%2e",
        b"/v1/files/..;/admin",
        b"/v1/files/..;x=1/admin",
        b"/v1/files;jsessionid=1/file-x",
        b"/v1/files/file-x%3b",
        # an encoded separator in an id
        b"/v1/files/file-a%2ffile-b",
        b"/v1/files/file-a%2Ffile-b",
        b"/v1/files/file-a%5cfile-b",
        b"/v1/files/file-a\\file-b",
        b"/v1/chat%2fcompletions",
        # double encoding, hidden query and fragment, controls
        b"/v1/files/%252e%252e",
        b"/v1/files/a%3fb",
        b"/v1/files/a%23b",
        b"/v1/files/a%00",
        b"/v1/files/a%0d%0aX-Evil:1",
        b"/v1/files/a%7f",
        # malformed escapes
        b"/v1/files/a%zz",
        b"/v1/files/a%2",
    ],
)
def test_a_target_with_no_canonical_form_is_refused(gw, up, sent):
    answer = send_raw(gw, get(sent))
    assert status(answer) == 400, answer[:300]
    assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "invalid_path"
    assert up.requests == []


def test_a_query_keeps_its_spelling_but_not_a_control_character(gw, up):
    answer = send_raw(gw, get(b"/v1/files?after=%66ile-1&x=a%2Fb"))
    assert status(answer) == 200
    assert up.requests[0].target == "/base/v1/files?after=%66ile-1&x=a%2Fb"
    for bad in (b"/v1/files?a=\x01", b"/v1/files?a=1#frag", b"/v1/files#frag"):
        assert status(send_raw(gw, get(bad))) == 400
    assert len(up.requests) == 1


# ---------------------------------------------------------------- a bounded head


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Long: ", 431),  # a header value
        (b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-", 431),  # a header name
        (  # a chunked body's trailer field, after the body
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n4\r\nabcd\r\n0\r\nX-Trailer: ",
            431,
        ),
        (b"GET /v1/", 414),  # the target
    ],
    ids=["header-value", "header-name", "trailer", "target"],
)
def test_a_head_that_never_ends_is_refused_and_the_gateway_stays_responsive(gw, prefix, expected):
    """A field sent slowly, without its CRLF: the gateway counts the bytes as they arrive and
    refuses once they pass 64 KiB — it does not hold what the client sends for as long as it
    sends it (httptools holds a field until its end) — and serves another connection
    meanwhile."""
    limit = 64 * 1024
    piece = b"a" * 2048
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port_of(gw)), timeout=10) as s:
        s.sendall(prefix)
        s.setblocking(False)
        # at most 16x the limit: the old edge read on for as long as the client sent
        while sent < 16 * limit and not answer:
            try:
                s.sendall(piece)
                sent += len(piece)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                pass
            time.sleep(0.002)  # separate reads: the field grows across them
            try:
                answer = s.recv(65536)
            except BlockingIOError:
                pass
            except ConnectionResetError:
                break
            if sent == limit // 2:  # midway: another client is still served
                assert status(send_raw(gw, get(b"/healthz"))) == 200
        s.setblocking(True)
        if answer and b"\r\n\r\n" not in answer:
            answer += s.recv(65536)
    assert status(answer) == expected, answer[:200]
    # refused within a few reads past the limit, not after whatever the client chose to send
    assert sent <= limit + 32 * len(piece)


# ---------------------------------------------------------------- Host


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/files HTTP/1.1\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: gw\r\nHost: evil.example\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: gw\r\nhost: gw\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: gw/x\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: user@gw\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: gw:80:80\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: gw:http\r\n\r\n",
        b"GET /v1/files HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
    ],
    ids=["none", "two", "two-same", "slash", "userinfo", "two-ports", "named-port", "two-1.0"],
)
def test_not_exactly_one_valid_host_is_400(gw, up, head):
    answer = send_raw(gw, head)
    assert status(answer) == 400, answer[:300]
    assert b'"invalid_host"' in answer
    assert up.requests == []


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/files HTTP/1.0\r\n\r\n",  # HTTP/1.0 may omit it
        b"GET /v1/files HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /v1/files HTTP/1.1\r\nHost: \r\n\r\n",  # RFC 9112 §3.2: empty authority
    ],
    ids=["1.0-none", "ipv6", "ipv4", "empty"],
)
def test_one_valid_host_is_served(gw, up, head):
    assert status(send_raw(gw, head)) == 200
    assert len(up.requests) == 1


# ---------------------------------------------------------------- TRACE and CONNECT


@pytest.mark.parametrize(
    "head",
    [
        b"TRACE /v1/files HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"TRACE /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"TRACE * HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n",
    ],
    ids=["trace-passthrough", "trace-model", "trace-asterisk", "connect"],
)
def test_trace_and_connect_are_405_and_never_reach_the_upstream(gw, up, head):
    answer = send_raw(gw, head)
    assert status(answer) == 405, answer[:300]
    assert b"allow: " in answer.lower() and b'"method_not_allowed"' in answer
    assert b"sk-backend-secret" not in answer  # a reflecting upstream would have echoed it
    assert up.requests == []


def test_the_reflecting_upstream_does_echo_what_it_gets(gw, up):
    """The stand-in reflects: were TRACE forwarded, its answer would hold the backend's key."""
    answer = send_raw(gw, get(b"/v1/echo"))
    assert b"Bearer sk-backend-secret-for-tests" in answer


# ---------------------------------------------------------------- lingering close


def _read_answer(s: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        got = s.recv(65536)
        if not got:
            break
        out += got
    head, _, rest = out.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
            while len(rest) < length:
                got = s.recv(65536)
                if not got:
                    break
                rest += got
    return head + b"\r\n\r\n" + rest


def test_an_early_413_closes_instead_of_reading_the_declared_body(gateway, up):
    """A body declared far over ``max_body_bytes``: 413 at once, then the connection ends —
    half-closed after the answer (the client reads an end, not a reset), its unread body
    dropped — instead of the gateway reading gigabytes nobody will use."""
    toml = config(f"http://127.0.0.1:{up.port}/base/v1") + "[server]\nmax_body_bytes = 1000\n"
    gw = gateway(gateway_config(toml))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 10000000000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(gw)), timeout=10) as s:
        s.sendall(head + b"x" * 65536)
        answer = _read_answer(s)
        assert status(answer) == 413
        assert b"connection: close" in answer.lower()
        # the gateway's side is closed: the client reads the end (within the socket timeout;
        # the old edge kept the connection open for the declared ten gigabytes)
        assert s.recv(65536) == b""
    assert up.requests == []


def test_a_client_that_keeps_sending_after_an_early_answer_is_cut_off(gateway, up):
    toml = config(f"http://127.0.0.1:{up.port}/base/v1") + "[server]\nmax_body_bytes = 1000\n"
    gw = gateway(gateway_config(toml))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 10000000000\r\n\r\n"
    cut = False
    with socket.create_connection(("127.0.0.1", port_of(gw)), timeout=10) as s:
        s.sendall(head)
        assert status(_read_answer(s)) == 413
        # keep sending (at most ~10 s of it: a lingering close ends within a few seconds)
        for _ in range(2000):
            try:
                s.sendall(b"x" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            time.sleep(0.005)
    assert cut
    assert up.requests == []


def test_a_small_body_answered_early_still_keeps_the_connection(gw, up):
    """A request whose whole body was read before its answer (nearly all) keeps keep-alive:
    only a body still owed ends the connection."""
    with socket.create_connection(("127.0.0.1", port_of(gw)), timeout=10) as s:
        for _ in range(3):
            s.sendall(post(b"/v1/chat/completions", BODY))
            answer = _read_answer(s)
            assert status(answer) == 200
            assert b"connection: close" not in answer.lower()
    assert len(up.requests) == 3
