"""Two gateway replicas share MCP sessions through Redis (docs/spec.md §23)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.mcp_support import Alternating, McpUpstream, mcp_client, mcp_config
from tests.redis_support import RedisServer


@pytest.fixture
def mcp_upstream() -> Iterator[McpUpstream]:
    server = McpUpstream().start()
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/mcp/up", "/mcp"])
def test_a_session_moves_between_replicas(gateway, mcp_upstream, path):
    with RedisServer() as redis:
        extra = f'[auth]\nredis_url = "{redis.url}"\n'
        one = gateway(mcp_config(mcp_upstream.mcp_url, extra=extra))
        two = gateway(mcp_config(mcp_upstream.mcp_url, extra=extra))
        transport = Alternating([one.port, two.port])
        tool = "echo" if path == "/mcp/up" else "up__echo"

        async def scenario() -> list[str]:
            texts = []
            async with (
                httpx2.AsyncClient(transport=transport, timeout=30) as http,
                Client(
                    streamable_http_client(one.url + path, http_client=http), mode="legacy"
                ) as client,  # type: ignore[arg-type]
            ):
                await client.list_tools()
                for i in range(4):
                    result = await client.call_tool(tool, {"text": f"turn {i}"})
                    texts.append(result.content[0].text)  # type: ignore[union-attr]
            return texts

        texts = asyncio.run(scenario())
        keys = asyncio.run(_session_keys(redis.url))
    assert texts == [f"turn {i}" for i in range(4)]
    assert {one.port, two.port} <= set(transport.sent)  # both replicas served the session
    # one upstream session for the whole client session, whichever replica asked
    upstream_sids = {s.headers.get("mcp-session-id") for s in mcp_upstream.calls("tools/call")}
    assert len(upstream_sids) == 1
    assert keys == 0  # DELETE at the client's end removed the shared record


async def _session_keys(url: str) -> int:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        return len(await client.keys("gateway:mcp-session:*"))
    finally:
        await client.aclose()


def test_a_dead_redis_leaves_each_replica_its_own_sessions(gateway, mcp_upstream):
    with RedisServer() as redis:
        extra = f'[auth]\nredis_url = "{redis.url}"\n'
        gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=extra))

        async def scenario() -> list[str]:
            texts = []
            async with mcp_client(gw.url + "/mcp/up") as client:
                await client.list_tools()
                redis.kill()  # the session was made while Redis was up: this replica has it
                for i in range(4):  # the breaker opens after a few failed lookups
                    result = await client.call_tool("echo", {"text": f"turn {i}"})
                    texts.append(result.content[0].text)  # type: ignore[union-attr]
            return texts

        assert asyncio.run(scenario()) == [f"turn {i}" for i in range(4)]
