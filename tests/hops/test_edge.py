"""The edge hop: trust, header hygiene both ways, X-Forwarded-*, request ids."""

from __future__ import annotations

import http.client

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import EdgeConfig
from gateway.hops.edge import HOP_BY_HOP, RequestEdge, _raw_time
from tests.conftest import BACKEND_KEY
from tests.support import answering, config_for, http_response

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
CLIENT_KEY = "sk-client-secret-must-not-travel"


def scope(headers: list[tuple[bytes, bytes]], client: str = "127.0.0.1") -> dict:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": headers,
        "client": (client, 50000),
        "scheme": "http",
    }


# ---------------------------------------------------------------- unit: trust table


@pytest.mark.parametrize(
    ("trusted", "peer", "xff", "want_forwarded", "want_client"),
    [
        (["127.0.0.1/32"], "127.0.0.1", b"203.0.113.7", "203.0.113.7, 127.0.0.1", "203.0.113.7"),
        (["127.0.0.1/32"], "127.0.0.1", None, "127.0.0.1", "127.0.0.1"),
        ([], "127.0.0.1", b"203.0.113.7", "127.0.0.1", "127.0.0.1"),
        (["10.0.0.0/8"], "192.0.2.1", b"203.0.113.7", "192.0.2.1", "192.0.2.1"),
        # a chain through two of our proxies: the client is the first untrusted from the right
        (
            ["10.0.0.0/8"],
            "10.0.0.2",
            b"198.51.100.9, 10.0.0.1",
            "198.51.100.9, 10.0.0.1, 10.0.0.2",
            "198.51.100.9",
        ),
        # a spoofed left-most entry does not fool the walk
        (
            ["10.0.0.0/8"],
            "10.0.0.2",
            b"1.1.1.1, 198.51.100.9",
            "1.1.1.1, 198.51.100.9, 10.0.0.2",
            "198.51.100.9",
        ),
        (["::1/128"], "::1", b"2001:db8::5", "2001:db8::5, ::1", "2001:db8::5"),
        (["127.0.0.1/32"], "not-an-ip", b"203.0.113.7", "not-an-ip", "not-an-ip"),
    ],
)
def test_x_forwarded_for_trust_table(trusted, peer, xff, want_forwarded, want_client):
    edge = RequestEdge(EdgeConfig(trusted_proxies=tuple(trusted)))
    headers = [(b"x-forwarded-for", xff)] if xff else []
    ctx = edge.accept(scope(headers, peer))
    fwd = dict(ctx.upstream_headers)
    assert fwd["x-forwarded-for"] == want_forwarded
    assert ctx.client_address == want_client


@pytest.mark.parametrize("trusted", [True, False])
def test_forwarded_proto_and_host_only_from_trusted(trusted):
    edge = RequestEdge(EdgeConfig(trusted_proxies=("127.0.0.1/32",) if trusted else ()))
    ctx = edge.accept(
        scope(
            [
                (b"host", b"gw.internal:8080"),
                (b"x-forwarded-proto", b"https"),
                (b"x-forwarded-host", b"api.example.com"),
            ]
        )
    )
    fwd = dict(ctx.upstream_headers)
    assert fwd["x-forwarded-proto"] == ("https" if trusted else "http")
    assert fwd["x-forwarded-host"] == ("api.example.com" if trusted else "gw.internal:8080")


def test_hop_by_hop_and_connection_named_headers_are_not_forwarded():
    edge = RequestEdge(EdgeConfig())
    headers = [(name, b"x") for name in sorted(HOP_BY_HOP)] + [
        (b"connection", b"keep-alive, X-Secret-Hop"),
        (b"x-secret-hop", b"1"),
        (b"x-keep-me", b"1"),
        (b"authorization", b"Bearer sk-client"),
        (b"api-key", b"sk-azure-style"),
        (b"host", b"gw"),
    ]
    ctx = edge.accept(scope(headers))
    names = {k.lower() for k, _ in ctx.upstream_headers}
    assert names.isdisjoint({n.decode() for n in HOP_BY_HOP})
    assert "x-secret-hop" not in names
    assert "authorization" not in names and "api-key" not in names and "host" not in names
    assert "x-keep-me" in names
    assert ctx.credential == b"sk-azure-style"


@pytest.mark.parametrize(
    ("incoming", "kept"),
    [
        (b"req-123", True),
        (b"a" * 200, True),
        (b"a" * 201, False),
        (b"has space", False),
        (b"", False),
        (b"\xff\xfe", False),
    ],
)
def test_request_id_kept_when_sane_else_generated(incoming, kept):
    ctx = RequestEdge(EdgeConfig()).accept(scope([(b"x-request-id", incoming)]))
    if kept:
        assert ctx.request_id == incoming.decode()
    else:
        assert len(ctx.request_id) == 32 and ctx.request_id != incoming.decode("latin-1")
    assert dict(ctx.upstream_headers)["x-request-id"] == ctx.request_id


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"t=1700000000.123", 1700000000.123),
        (b"t=1700000000123", 1700000000.123),
        (b"t=1700000000123456", 1700000000.123456),
        (b"1700000000123", 1700000000.123),
        (b"1700000000", 1700000000.0),
        (b"t=1700000000123456789", 1700000000.123456789),
        (b"t=1700000000123 D=5", 1700000000.123),
        (b"garbage", None),
        (b"t=", None),
        (b"-5", None),
        (b"nan", None),
        (None, None),
    ],
)
def test_request_start_units_by_magnitude(raw, want):
    got = _raw_time(raw)
    if want is None:
        assert got is None
    else:
        assert got == pytest.approx(want, abs=1e-6)


@given(st.binary(max_size=40))
def test_request_start_parser_never_raises(raw):
    got = _raw_time(raw)
    assert got is None or got > 0


# ---------------------------------------------------------------- integration: both directions


def test_hygiene_end_to_end(gateway, upstream):
    async def answer(req, writer):
        writer.write(
            http_response(
                200,
                b'{"ok": true}',
                extra=[
                    ("Connection", "keep-alive, X-Upstream-Hop"),
                    ("X-Upstream-Hop", "secret"),
                    ("Keep-Alive", "timeout=5"),
                    ("Proxy-Authenticate", "Basic"),
                    ("Trailer", "X-Checksum"),
                    ("Upgrade", "h2c"),
                    ("X-Request-Id", "upstream-own-id"),
                    ("X-Visible", "yes"),
                ],
            )
        )
        return True

    up = upstream(answer)
    gw = gateway(config_for(up.url))
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.putrequest(
            "POST", "/v1/chat/completions?api-version=2024-06-01", skip_accept_encoding=True
        )
        for k, v in [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(CHAT))),
            ("Authorization", f"Bearer {CLIENT_KEY}"),
            ("Connection", "keep-alive, X-Client-Hop"),
            ("X-Client-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
            ("Proxy-Connection", "keep-alive"),
            ("X-Forwarded-For", "203.0.113.7"),
            ("X-Request-Id", "client-chosen-id"),
            ("X-Custom", "passes"),
        ]:
            conn.putheader(k, v)
        conn.endheaders(CHAT)
        resp = conn.getresponse()
        body = resp.read()
        resp_headers = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()

    assert resp.status == 200 and body == b'{"ok": true}'
    (seen,) = up.requests
    names = seen.header_names()
    for hop in (
        "connection",
        "x-client-hop",
        "keep-alive",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
        "upgrade",
    ):
        assert hop not in names, hop
    assert seen.header("x-custom") == "passes"
    # the backend's own key, never the client's
    assert seen.header("authorization") == f"Bearer {BACKEND_KEY}"
    assert all(CLIENT_KEY not in v for _, v in seen.headers)
    assert seen.header("x-forwarded-for") == "203.0.113.7, 127.0.0.1"
    assert seen.header("x-forwarded-proto") == "http"
    assert seen.header("x-request-id") == "client-chosen-id"
    assert seen.target == "/v1/chat/completions?api-version=2024-06-01"
    assert seen.body == CHAT
    # and on the way back
    for hop in ("x-upstream-hop", "keep-alive", "proxy-authenticate", "trailer", "upgrade"):
        assert hop not in resp_headers, hop
    assert resp_headers.get("connection", "keep-alive") == "keep-alive"
    assert resp_headers["x-visible"] == "yes"
    assert resp_headers["x-request-id"] == "client-chosen-id"
    assert resp_headers["x-upstream-request-id"] == "upstream-own-id"


def test_generated_request_id_is_forwarded_and_returned(gateway, upstream):
    answer = answering(b"{}")

    up = upstream(answer)
    gw = gateway(config_for(up.url))
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", body=CHAT)
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    rid = resp.getheader("x-request-id")
    assert rid and len(rid) == 32
    assert up.requests[0].header("x-request-id") == rid


def test_untrusted_peer_chain_is_replaced(gateway, upstream):
    answer = answering(b"{}")

    up = upstream(answer)
    gw = gateway(config_for(up.url, extra="[edge]\ntrusted_proxies = []"))
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=CHAT,
            headers={"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil"},
        )
        conn.getresponse().read()
    finally:
        conn.close()
    assert up.requests[0].header("x-forwarded-for") == "127.0.0.1"
    assert up.requests[0].header("x-forwarded-host") == f"127.0.0.1:{gw.port}"


def test_upstream_connections_are_reused(gateway, upstream):
    answer = answering(b'{"ok": 1}')

    up = upstream(answer)
    gw = gateway(config_for(up.url))
    # twenty requests from twenty different client connections
    for _ in range(20):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        try:
            conn.request("POST", "/v1/chat/completions", body=CHAT)
            assert conn.getresponse().read() == b'{"ok": 1}'
        finally:
            conn.close()
    assert len(up.requests) == 20
    assert up.connections == 1


@pytest.mark.parametrize("header", ["x-api-key", "api-key", "authorization"])
def test_no_client_credential_header_reaches_the_upstream(gateway, upstream, header):
    """SPEC §5: Authorization, api-key and x-api-key (what the Anthropic SDK sends) are the
    client's credential; the upstream gets only the backend's own key."""
    up = upstream(answering(b'{"ok": true}'))
    gw = gateway(config_for(up.url))
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=CHAT,
            headers={"Content-Type": "application/json", header: CLIENT_KEY},
        )
        assert conn.getresponse().read() == b'{"ok": true}'
    finally:
        conn.close()
    (seen,) = up.requests
    assert all(CLIENT_KEY not in v for _, v in seen.headers), seen.headers
    assert seen.header("x-api-key") is None and seen.header("api-key") is None
    assert seen.header("authorization") == f"Bearer {BACKEND_KEY}"
