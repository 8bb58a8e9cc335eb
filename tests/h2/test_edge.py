"""HTTP/2 and TLS at the gateway's edge, as clients use them (docs/spec.md §27): the official SDKs
on HTTP/2 clients over TLS (ALPN h2) and in clear (h2c), curl, the Timeline and telemetry per
stream, the server's rules on a stream, uploads and downloads, mTLS, the TLS versions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess

import httpx2
import openai
import orjson
import pytest

from tests.h2.support import MOCK, Certs, H2Client, http2_client
from tests.model_api_support import traced
from tests.support import (
    GatewayServer,
    SeenRequest,
    anthropic_client,
    chunk,
    gateway_config,
    openai_client,
    sse_head,
)

MSG = [{"role": "user", "content": "hi"}]


def tls_gateway(gateway, certs: Certs, extra: str = "") -> GatewayServer:
    return gateway(gateway_config(MOCK + certs.toml() + extra))


def test_the_sdks_speak_http2_over_tls(gateway, certs):
    gw = tls_gateway(gateway, certs)
    with http2_client(certs) as http:
        client = openai_client(gw.base_url, http_client=http)
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=MSG)
        assert raw.http_response.http_version == "HTTP/2"
        assert raw.parse().choices[0].message.content
        # the Timeline per stream: Server-Timing on the stream's answer
        assert "intake;dur=" in raw.headers["server-timing"]
        chunks = list(client.chat.completions.create(model="gpt-4o", messages=MSG, stream=True))
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert "".join(c.choices[0].delta.content or "" for c in chunks)
        assert client.responses.create(model="gpt-4o", input="hi").output_text
        claude = anthropic_client(gw.url, http_client=http)
        message = claude.messages.create(model="claude-sonnet-4", max_tokens=20, messages=MSG)
        assert message.content[0].text
        with claude.messages.stream(model="claude-sonnet-4", max_tokens=20, messages=MSG) as stream:
            assert "".join(stream.text_stream) == stream.get_final_message().content[0].text


def test_h2c_by_prior_knowledge_beside_http1_on_one_port(gateway):
    gw = gateway(gateway_config(MOCK + "[server]\nh2c = true\n"))
    with http2_client() as http:
        raw = openai_client(gw.base_url, http_client=http).chat.completions.with_raw_response
        answer = raw.create(model="gpt-4o", messages=MSG)
        assert answer.http_response.http_version == "HTTP/2"
    # the same port keeps serving HTTP/1.1
    plain = openai_client(gw.base_url).chat.completions.with_raw_response
    assert plain.create(model="gpt-4o", messages=MSG).http_response.http_version == "HTTP/1.1"
    # without h2c the preface is no HTTP/1.1 request: 400, never HTTP/2
    gw1 = gateway(gateway_config(MOCK))
    with http2_client() as http, pytest.raises(httpx2.HTTPError):
        http.get(gw1.url + "/healthz")


def _curl(*args: str) -> tuple[str, str]:
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-w", "\n%{http_version}", *args],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    body, _, version = out.rpartition("\n")
    return body, version


def test_curl_http2_over_tls_and_prior_knowledge(gateway, certs):
    gw = tls_gateway(gateway, certs)
    chat = ["-H", "content-type: application/json", gw.base_url + "/chat/completions"]
    body = json.dumps({"model": "gpt-4o", "messages": MSG})
    got, version = _curl("--http2", "--cacert", str(certs.ca_pem), "-d", body, *chat)
    assert version == "2" and json.loads(got)["object"] == "chat.completion"
    streamed = json.dumps({"model": "gpt-4o", "messages": MSG, "stream": True})
    got, version = _curl("--http2", "-N", "--cacert", str(certs.ca_pem), "-d", streamed, *chat)
    assert version == "2" and got.rstrip().endswith("data: [DONE]")
    # a client that offers only http/1.1 is served HTTP/1.1 over the same TLS port
    _, version = _curl("--http1.1", "--cacert", str(certs.ca_pem), gw.url + "/healthz")
    assert version == "1.1"
    h2c = gateway(gateway_config(MOCK + "[server]\nh2c = true\n"))
    got, version = _curl(
        "--http2-prior-knowledge", "-d", body, *chat[:2], h2c.base_url + "/chat/completions"
    )
    assert version == "2" and json.loads(got)["object"] == "chat.completion"


def test_spans_and_metrics_name_the_protocol(gateway, certs, receiver):
    gw = tls_gateway(gateway, certs, traced(receiver.endpoint))
    with http2_client(certs) as http:
        openai_client(gw.base_url, http_client=http).chat.completions.create(
            model="gpt-4o", messages=MSG
        )
    with httpx2.Client(verify=certs.client_context(("http/1.1",))) as http:
        openai_client(gw.base_url, http_client=http).chat.completions.create(
            model="gpt-4o", messages=MSG
        )
    spans = receiver.wait_for(lambda got: sum(s.parent_span_id is None for s in got) == 2)
    roots = [s for s in spans if s.parent_span_id is None]
    assert sorted(r.attributes["network.protocol.version"] for r in roots) == ["1.1", "2"]
    assert {r.attributes["url.scheme"] for r in roots} == {"https"}
    metrics = httpx2.get(gw.url + "/metrics", verify=certs.client_context()).text
    for protocol in ("HTTP/1.1", "HTTP/2"):
        line = f'gateway_requests_by_protocol_total{{protocol="{protocol}"}} 1.0'
        assert line in metrics, metrics


def test_the_server_rules_hold_on_a_stream(gateway, certs):
    """docs/spec.md §25 on HTTP/2: each refusal ends its stream, not the connection."""
    gw = tls_gateway(gateway, certs)
    with H2Client(gw.port, certs.client_context()) as c:
        trace = c.answer(c.request("TRACE", "/v1/models"))
        assert trace.status == 405 and b"method_not_allowed" in trace.body
        dots = c.answer(c.request("GET", "/v1/%2e%2e/models"))
        assert dots.status == 400 and b"invalid_path" in dots.body
        foreign = c.answer(
            c.request("POST", "/v1/chat/completions", b"{}", [("origin", "https://evil.example")])
        )
        assert foreign.status == 403 and b"origin_not_allowed" in foreign.body
        many = [(f"x-h{i}", "v") for i in range(100)]
        crowded = c.answer(c.request("GET", "/v1/models", headers=many))
        assert crowded.status == 431
        # the connection still serves: a canonical request answers
        fine = c.answer(c.request("GET", "/v1//models/"))
        assert fine.status == 200 and b'"object":"list"' in fine.body
        assert c.goaway is None
    # a Host naming another host than :authority is malformed (RFC 9113 §8.3.1): h2 ends the
    # connection (PROTOCOL_ERROR), nothing is answered
    with H2Client(gw.port, certs.client_context()) as c:
        other = c.request("GET", "/v1/models", headers=[("host", "other.example")])
        c.until_closed()
        assert c.goaway is not None and c.goaway.error_code == 1
        assert c.answers[other].status == 0


def test_uploads_and_downloads_stream_over_http2(gateway, certs, tmp_path):
    gw = tls_gateway(gateway, certs, "[server]\nmax_body_bytes = 1024\n")
    data = b'{"custom_id": "r1"}\n' * 50_000  # ~1 MB: many windows' worth
    with http2_client(certs) as http:
        client = openai_client(gw.base_url, http_client=http)
        made = client.files.create(file=("in.jsonl", data), purpose="batch")
        assert made.bytes == len(data)
        assert client.files.content(made.id).content == data
        # a model call's body over max_body_bytes, many windows of it: 413 as soon as its length
        # is known; the rest of the body is read and dropped (an httpx client sends it all
        # before it reads the answer), the connection stays
        with pytest.raises(openai.APIStatusError) as too_big:
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x" * 500_000}]
            )
        assert too_big.value.status_code == 413
        assert client.models.list().data


def test_mutual_tls(gateway, certs):
    gw = gateway(gateway_config(MOCK + certs.toml(f'client_ca_file = "{certs.ca_pem}"')))
    anonymous = httpx2.Client(http2=True, verify=certs.client_context())
    with anonymous, pytest.raises(httpx2.HTTPError):
        anonymous.get(gw.url + "/healthz")
    chain, key = certs.client_cert()
    ctx = certs.client_context()
    ctx.load_cert_chain(chain, key)
    with httpx2.Client(http2=True, verify=ctx) as known:
        answer = known.get(gw.url + "/healthz")
        assert answer.status_code == 200 and answer.http_version == "HTTP/2"


def test_min_version_13_refuses_a_tls12_client(gateway, certs):
    gw = gateway(gateway_config(MOCK + certs.toml('min_version = "1.3"')))
    old = certs.client_context()
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with httpx2.Client(verify=old) as http, pytest.raises(httpx2.ConnectError):
        http.get(gw.url + "/healthz")
    with httpx2.Client(verify=certs.client_context()) as http:
        assert http.get(gw.url + "/healthz").status_code == 200


def test_realtime_stays_http1_over_tls(gateway, certs):
    """WebSocket over HTTP/2 (RFC 8441) is not offered: wss:// connects on HTTP/1.1."""
    from websockets.asyncio.client import connect

    gw = tls_gateway(gateway, certs)
    ws_url = f"wss://127.0.0.1:{gw.port}/v1/realtime?model=gpt-4o-realtime"

    async def session() -> str:
        ctx = certs.client_context(("http/1.1",))
        async with connect(ws_url, ssl=ctx, additional_headers={"authorization": "Bearer k"}) as ws:
            return orjson.loads(await ws.recv())["type"]

    assert asyncio.run(session()) == "session.created"


def held_stream(sent: list[int], release: asyncio.Event | None = None):
    """An upstream chat stream of many events (one per 10 ms): ``sent`` counts them."""

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        for i in range(200):
            event = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
            writer.write(chunk(b"data: " + orjson.dumps(event) + b"\n\n"))
            await writer.drain()
            sent.append(i)
            await asyncio.sleep(0.01)
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return True

    return handler


def test_a_tls_handshake_that_never_comes_is_dropped(gateway, certs):
    gw = gateway(gateway_config(MOCK + certs.toml() + "[server]\nclient_header_timeout_s = 1\n"))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
        got = b"reset"
        with contextlib.suppress(ConnectionResetError):
            got = sock.recv(1)
        assert got in (b"", b"reset")  # closed, not held for ever (recv would time out)


def test_connections_beyond_max_client_connections_get_goaway(gateway, certs):
    gw = gateway(gateway_config(MOCK + certs.toml() + "[server]\nmax_client_connections = 1\n"))
    with H2Client(gw.port, certs.client_context()) as first:
        assert first.answer(first.request("GET", "/healthz")).status == 200
        with H2Client(gw.port, certs.client_context()) as second:
            assert second.until_closed()
            assert second.goaway is not None and second.goaway.last_stream_id == 0
            assert second.goaway.additional_data == b"max_client_connections"
        assert first.answer(first.request("GET", "/healthz")).status == 200


def test_expect_100_continue_on_a_stream(gateway, certs):
    """The informational 100 goes out when the app first reads the body, not before."""
    gw = tls_gateway(gateway, certs)
    body = orjson.dumps({"model": "gpt-4o", "messages": MSG})
    head = [("content-type", "application/json"), ("expect", "100-continue")]
    head.append(("content-length", str(len(body))))
    with H2Client(gw.port, certs.client_context()) as c:
        sid = c.request("POST", "/v1/chat/completions", headers=head, end=False)
        assert c.until(lambda: c.answers[sid].informational == [100])
        c.conn.send_data(sid, body, end_stream=True)
        c.flush()
        answer = c.answer(sid)
        assert answer.status == 200 and b"chat.completion" in answer.body
