"""An OpenAI Agents SDK agent whose tools are MCP tools behind the gateway
(``MCPServerStreamableHttp``) and whose model is the gateway's mock: model calls and tool calls
of one run both go through the gateway (docs/spec.md §23)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from openai import AsyncOpenAI

from tests.mcp.mcp_support import KEY, McpUpstream, keys_section, mcp_config


@pytest.fixture
def mcp_upstream() -> Iterator[McpUpstream]:
    server = McpUpstream().start()
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/mcp/up", "/mcp"])
def test_an_agent_calls_mcp_tools_through_the_gateway(gateway, mcp_upstream, path):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=keys_section()))
    set_tracing_disabled(True)

    async def main() -> tuple[Any, list[str]]:
        client = AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        params: Any = {"url": gw.url + path, "headers": {"Authorization": f"Bearer {KEY}"}}
        try:
            async with MCPServerStreamableHttp(params=params, name="gateway") as server:
                names = sorted(t.name for t in await server.list_tools())
                agent = Agent(
                    name="Tools",
                    instructions="Use the tools.",
                    model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client),
                    mcp_servers=[server],
                )
                async with asyncio.timeout(60):
                    result = await Runner.run(agent, "Echo something")
                return result.final_output, names
        finally:
            await client.close()

    final, names = asyncio.run(main())
    prefix = "up__" if path == "/mcp" else ""
    assert f"{prefix}echo" in names and f"{prefix}secret" not in names
    # the mock model called the first tool; the gateway forwarded it to the tool server
    (call,) = mcp_upstream.calls("tools/call")
    assert call.json()["params"]["name"] in ("add", "echo", "slow")
    assert call.headers.get("authorization") != f"Bearer {KEY}"  # the client's key stays here
    assert final
