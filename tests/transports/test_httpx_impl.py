"""``http2 = true`` backends (httpx2) against a real HTTP/2 server (hypercorn, h2c on loopback)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from gateway.mock.upstream_app import create_mock_app
from tests.support import config_for, free_port, openai_client


class H2Upstream:
    """The mock backend served over HTTP/2 (prior knowledge) by hypercorn in a thread."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.port = free_port()
        self.versions: list[str] = []
        self.delay_s = delay_s
        self._app = create_mock_app()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _asgi(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.versions.append(scope["http_version"])
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        await self._app(scope, receive, send)

    def _run(self) -> None:
        cfg = HypercornConfig()
        cfg.bind = [f"127.0.0.1:{self.port}"]
        cfg.accesslog = None
        cfg.errorlog = None

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self._asgi, cfg, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        asyncio.run(main())

    def start(self) -> H2Upstream:
        self._thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with httpx2.Client(http1=False, http2=True) as c:
                    c.get(f"{self.url}/models")
                return self
            except httpx2.TransportError:
                time.sleep(0.05)
        raise RuntimeError("hypercorn did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def h2() -> Iterator[H2Upstream]:
    up = H2Upstream().start()
    up.versions.clear()
    yield up
    up.stop()


def test_chat_json_and_stream_over_http2(gateway, h2):
    gw = gateway(config_for(h2.url, backend_extra="http2 = true"))
    client = openai_client(gw.base_url)
    msgs = [{"role": "user", "content": "over h2"}]
    answer = client.chat.completions.create(model="mock-gpt-4o", messages=msgs)
    chunks = list(
        client.chat.completions.create(
            model="mock-gpt-4o", messages=msgs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content
    assert chunks[-1].usage is not None
    emb = client.embeddings.create(model="mock-embedding-3-small", input="x")
    assert len(emb.data[0].embedding) == 1536
    # every request reached the upstream over HTTP/2
    assert h2.versions and set(h2.versions) == {"2"}


def test_http2_read_timeout_is_504(gateway):
    slow = H2Upstream().start()
    try:
        slow.delay_s = 3
        gw = gateway(config_for(slow.url, backend_extra="http2 = true\nread_timeout_s = 0.3"))
        r = httpx2.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            timeout=10,
        )
    finally:
        slow.stop()
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_read_timeout"


def test_http2_backend_unreachable_is_502(gateway):
    gw = gateway(
        config_for(
            f"http://127.0.0.1:{free_port()}/v1",
            backend_extra="http2 = true",
            route_extra="retries = 0",
        )
    )
    r = httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_connect_error"


def test_http2_pool_does_not_reuse_a_connection_idle_past_idle_timeout(h2):
    from gateway.config import BackendConfig
    from gateway.transports.httpx_impl import HttpxTransport

    ports: list[int] = []
    app = h2._app

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            ports.append(scope["client"][1])  # one client port per connection
        await app(scope, receive, send)

    h2._app = asgi

    async def one(t: HttpxTransport) -> None:
        resp = await t.request("GET", h2.url + "/models", [], None)
        assert resp.status == 200
        async for _ in resp.aiter_raw():
            pass
        await resp.aclose()

    async def main() -> None:
        t = HttpxTransport(BackendConfig(name="b", url=h2.url, http2=True, idle_timeout_s=0.1))
        await one(t)
        await one(t)  # at once: the same connection
        await asyncio.sleep(0.3)  # idle past idle_timeout_s
        await one(t)
        await t.aclose()

    asyncio.run(main())
    assert ports[0] == ports[1] != ports[2]
