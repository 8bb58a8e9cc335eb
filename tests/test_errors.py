"""SPEC §5 error table (the rows the proxy core owns), over real sockets, in the OpenAI shape."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import httpx2
import openai
import pytest

from tests.support import config_for, free_port, gateway_config, http_response, openai_client

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def assert_openai_error(resp: httpx2.Response, status: int, type_: str) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert err["type"] == type_ and err["param"] is None
    assert isinstance(err["message"], str) and err["message"]
    assert resp.headers["x-request-id"]
    return err


@pytest.fixture
def gw(gateway, mock_upstream):
    return gateway(config_for(mock_upstream.url + "/v1", extra="[server]\nmax_body_bytes = 4096"))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "'model'"),
        (b'{"model": 7, "messages": []}', "'model'"),
        (b'{"model": "m", "messages": "hi"}', "'messages'"),
        (b'{"model": "m", "messages": []}', "'messages'"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "'messages[0]'"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "'stream'"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": "5"}', "'max_tokens'"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}', "'max_tokens'"),
        (b'{"model": "m", "messages": [{"role": "user"}], "temperature": "hot"}', "'temperature'"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream_options": 1}', "stream_options"),
    ],
)
def test_400_invalid_request(gw, body, needle):
    resp = httpx2.post(
        gw.base_url + "/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    err = assert_openai_error(resp, 400, "invalid_request_error")
    assert needle in err["message"]
    assert resp.headers["x-should-retry"] == "false"


def test_400_for_completions_and_embeddings_shapes(gw):
    r1 = httpx2.post(gw.base_url + "/completions", json={"model": "m"})
    assert "'prompt'" in assert_openai_error(r1, 400, "invalid_request_error")["message"]
    r2 = httpx2.post(gw.base_url + "/embeddings", json={"model": "m", "input": []})
    assert "'input'" in assert_openai_error(r2, 400, "invalid_request_error")["message"]


def test_400_is_raised_by_the_sdk_as_bad_request(gw):
    client = openai_client(gw.base_url)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], extra_body={"n": "two"}
        )
    assert info.value.body["type"] == "invalid_request_error"


def test_404_no_route_for_model(gateway, mock_upstream):
    gw = gateway(
        gateway_config(
            f"""
[[backends]]
name = "up"
url = "{mock_upstream.url}/v1"
[[routes]]
models = ["gpt-4o*", "acc-?"]
backends = ["up"]
"""
        )
    )
    client = openai_client(gw.base_url)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="llama-3", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["type"] == "not_found_error"
    assert "llama-3" in info.value.message
    # the globs do route
    ok = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert ok.choices[0].message.content
    assert client.chat.completions.create(
        model="acc-1", messages=[{"role": "user", "content": "x"}]
    )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="acc-12", messages=[{"role": "user", "content": "x"}])


def test_404_unknown_path(gw):
    resp = httpx2.get(gw.url + "/nope")
    assert_openai_error(resp, 404, "not_found_error")


def test_413_declared_length(gw):
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 8000 + b'"}]}'
    resp = httpx2.post(gw.base_url + "/chat/completions", content=body)
    err = assert_openai_error(resp, 413, "payload_too_large")
    assert "4096" in err["message"]


def test_413_chunked_body_without_length(gw):
    def gen():
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    resp = httpx2.post(gw.base_url + "/chat/completions", content=gen())
    assert_openai_error(resp, 413, "payload_too_large")


def test_body_at_the_limit_is_accepted(gw):
    prefix = b'{"model": "m", "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    body = prefix + b"z" * (4096 - len(prefix) - len(suffix)) + suffix
    assert len(body) == 4096
    resp = httpx2.post(gw.base_url + "/chat/completions", content=body)
    assert resp.status_code == 200, resp.text


def test_502_upstream_unreachable(gateway):
    port = free_port()  # nothing listens here
    gw = gateway(config_for(f"http://127.0.0.1:{port}/v1", route_extra="retries = 1"))
    resp = httpx2.post(gw.base_url + "/chat/completions", json=CHAT)
    err = assert_openai_error(resp, 502, "upstream_error")
    assert err["code"] == "upstream_connect_error"
    assert resp.headers["x-should-retry"] == "true"


def test_502_upstream_resets_before_answering(gateway, upstream):
    async def reset(req, writer):
        writer.transport.abort()
        return False

    up = upstream(reset)
    gw = gateway(config_for(up.url))
    resp = httpx2.post(gw.base_url + "/chat/completions", json=CHAT)
    assert_openai_error(resp, 502, "upstream_error")
    # the request reached the upstream, so it is not retried (it may have run): one attempt
    assert len(up.requests) == 1


def test_502_short_body_is_never_a_truncated_200(gateway, upstream):
    async def short(req, writer):
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: 500\r\n\r\n" + b'{"id": "x", "choices": ['
        )
        await writer.drain()
        return False

    gw = gateway(config_for(upstream(short).url))
    resp = httpx2.post(gw.base_url + "/chat/completions", json=CHAT)
    err = assert_openai_error(resp, 502, "upstream_error")
    assert err["code"] == "upstream_bad_framing"


def test_504_upstream_read_timeout(gateway, upstream):
    async def stall(req, writer):
        await asyncio.sleep(5)
        return False

    gw = gateway(config_for(upstream(stall).url, backend_extra="read_timeout_s = 0.3"))
    client = openai_client(gw.base_url)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 504
    assert info.value.body["type"] == "upstream_timeout"
    assert info.value.body["code"] == "upstream_read_timeout"


def test_504_upstream_connect_timeout():
    """A listener whose accept queue is full drops SYNs: a real connect timeout on loopback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue (backlog 0 still admits one or two)
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.1)
        probe = socket.socket()
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
            connected = True
        except (TimeoutError, OSError):
            connected = False
        finally:
            probe.close()
        if connected:
            pytest.fail("the kernel accepted past a full backlog; cannot provoke a connect timeout")
        from tests.support import GatewayServer

        gw = GatewayServer(
            config_for(
                f"http://127.0.0.1:{port}/v1",
                backend_extra="connect_timeout_s = 0.3",
                route_extra="retries = 0",
            )
        ).start()
        try:
            resp = httpx2.post(gw.base_url + "/chat/completions", json=CHAT, timeout=10)
        finally:
            gw.stop()
        err = assert_openai_error(resp, 504, "upstream_timeout")
        assert err["code"] == "upstream_connect_timeout"
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_upstream_5xx_body_passed_through(gateway, upstream):
    async def fail(req, writer):
        writer.write(http_response(500, b'{"error": {"message": "boom", "type": "server_error"}}'))
        return True

    gw = gateway(config_for(upstream(fail).url))
    resp = httpx2.post(gw.base_url + "/chat/completions", json=CHAT)
    assert resp.status_code == 500
    assert resp.json() == {"error": {"message": "boom", "type": "server_error"}}


def test_errors_do_not_hang_with_concurrent_bad_requests(gw):
    """Many bad requests at once each get their answer (no hang, no loss)."""
    results: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        r = httpx2.post(gw.base_url + "/chat/completions", content=b"{" * (i + 1), timeout=10)
        with lock:
            results.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert results == [400] * 20


def test_upstream_redirect_is_a_502_and_never_followed(gateway, upstream):
    async def redirect(req, writer):
        writer.write(http_response(307, b"", extra=[("location", "http://198.51.100.1/steal")]))
        return True

    up = upstream(redirect)
    gw = gateway(config_for(up.url))
    resp = httpx2.post(gw.base_url + "/chat/completions", json=CHAT)
    err = assert_openai_error(resp, 502, "upstream_error")
    assert err["code"] == "upstream_redirect"
    assert "location" not in resp.headers
    assert len(up.requests) == 1  # not retried, not followed
