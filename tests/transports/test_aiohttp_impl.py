"""``http1_client = "aiohttp"``: the previous HTTP/1.1 client stays selectable and correct."""

from __future__ import annotations

import time

import openai
import pytest

from tests.support import config_for, openai_client, paced_upstream


def test_aiohttp_client_relays_json_and_streams(gateway, mock_upstream):
    gw = gateway(config_for(mock_upstream.url + "/v1", backend_extra='http1_client = "aiohttp"'))
    runtime = gw.app.runtime
    assert runtime is not None
    assert type(runtime.backends["up"].transport).__name__ == "AiohttpTransport"
    client = openai_client(gw.base_url, "x")
    msg = [{"role": "user", "content": "hi"}]
    answer = client.chat.completions.create(model="mock-gpt-4o", messages=msg)
    assert answer.choices[0].message.content
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="mock-gpt-4o", messages=msg, stream=True)
        if c.choices
    )
    assert text == answer.choices[0].message.content
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="mock-cut-2", messages=msg, stream=True))


def test_aiohttp_client_streams_unbuffered(gateway, upstream):
    sent_at: list[float] = []
    up = upstream(paced_upstream(sent_at, gap=0.15))
    gw = gateway(config_for(up.url, backend_extra='http1_client = "aiohttp"'))
    client = openai_client(gw.base_url, "x")
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True
    )
    arrived = []
    for _ in stream:
        arrived.append(time.monotonic())
        if len(arrived) == 3:
            # the third event is here before the upstream sent the fourth
            assert len(sent_at) <= 3
    assert len(arrived) >= 8


def test_aiohttp_pool_closes_idle_connections_after_idle_timeout(upstream):
    import asyncio

    from gateway.config import BackendConfig
    from gateway.transports.aiohttp_impl import AiohttpTransport
    from tests.support import answering, until

    up = upstream(answering(b"{}"))

    async def main() -> None:
        t = AiohttpTransport(BackendConfig(name="b", url=up.url, idle_timeout_s=0.1))
        resp = await t.request("GET", up.url + "/models", [], None)
        assert b"".join([c async for c in resp.aiter_raw()]) == b"{}"
        await resp.aclose()
        # no request comes: the pool itself closes the idle socket
        await until(lambda: up.closed_connections == 1, "the idle connection is closed")
        await t.aclose()

    asyncio.run(main())
    assert up.connections == 1
