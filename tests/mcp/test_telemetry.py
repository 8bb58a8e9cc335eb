"""MCP requests in spans, metrics, the access log; rpm counting tool calls; per-call timeouts
(docs/spec.md §23)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from tests.mcp.mcp_support import KEY, McpUpstream, keys_section, mcp_client, mcp_config
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
from tests.spend_support import sample


@pytest.fixture
def mcp_upstream() -> Iterator[McpUpstream]:
    server = McpUpstream().start()
    yield server
    server.stop()


async def _echo(url: str, key: str | None = None) -> str:
    async with mcp_client(url, key) as client:
        result = await client.call_tool("echo", {"text": "traced"})
        return str(result.content[0].text)  # type: ignore[union-attr]


def test_a_tool_call_is_a_span_with_its_trace_in_meta(gateway, mcp_upstream, access_lines):
    with OTLPReceiver("http") as receiver:
        extra = traced(receiver.endpoint) + '\n[logging]\naccess_log = "all"\n'
        gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=extra))
        assert asyncio.run(_echo(gw.url + "/mcp/up")) == "traced"
        spans = receiver.wait_for(lambda s: any(x.name == "tools/call echo" for x in s))
    (span,) = [s for s in spans if s.name == "tools/call echo"]
    a = span.attributes
    assert span.kind == "CLIENT"
    assert a["mcp.method.name"] == "tools/call" and a["gen_ai.tool.name"] == "echo"
    assert a["gen_ai.operation.name"] == "execute_tool" and len(a["mcp.session.id"]) == 32
    (root,) = [s for s in spans if s.span_id == span.parent_span_id]
    assert root.name == "POST /mcp/up" and root.attributes["mcp.method.name"] == "tools/call"
    assert (
        "gateway.overhead_ms" in root.attributes and "gateway.upstream_time_ms" in root.attributes
    )
    # the upstream got the CLIENT span as its parent, in params._meta (MCP conventions)
    meta = mcp_upstream.calls("tools/call")[-1].json()["params"]["_meta"]
    assert meta["traceparent"] == f"00-{span.trace_id}-{span.span_id}-01"
    (line,) = [x for x in access_lines if (x.get("mcp") or {}).get("method") == "tools/call"]
    assert line["mcp"]["tool"] == "echo" and line["mcp"]["status"] == "ok"
    assert line["backend"] == "up" and line["upstream_time_ms"] > 0
    assert "traced" not in orjson.dumps(access_lines).decode()  # no arguments in the log


def test_metrics_count_each_call_by_server_method_tool_and_status(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))
    name = "gateway_mcp_requests_total"

    async def scenario() -> None:
        async with mcp_client(gw.url + "/mcp/up") as client:
            await client.call_tool("echo", {"text": "a"})
            await client.call_tool("add", {"a": 1, "b": 2})
            with pytest.raises(MCPError):
                await client.call_tool("secret", {})

    asyncio.run(scenario())
    url = gw.url
    ok = {"server": "up", "method": "tools/call", "status": "ok"}
    assert sample(url, name, **ok, tool="echo") == 1
    assert sample(url, name, **ok, tool="add") == 1
    assert sample(url, name, server="up", method="tools/call", tool="secret", status="denied") == 1
    count = "gateway_mcp_request_duration_seconds_count"
    assert sample(url, count, server="up", method="tools/call") == 3


def test_rpm_counts_tool_calls_only(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=keys_section(rpm=2)))

    async def scenario() -> list[str]:
        outcomes = []
        async with mcp_client(gw.url + "/mcp/up", KEY) as client:
            await client.list_tools()  # initialize, list: not counted
            for _ in range(3):
                try:
                    await client.call_tool("add", {"a": 1, "b": 1})
                    outcomes.append("ok")
                except MCPError as exc:
                    outcomes.append(exc.error.message)
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes[:2] == ["ok", "ok"] and outcomes[2] != "ok"
    assert len(mcp_upstream.calls("tools/call")) == 2


def test_a_call_past_the_timeout_ends_with_a_jsonrpc_error(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, server_extra="timeout_s = 0.5"))

    async def scenario() -> MCPError:
        async with mcp_client(gw.url + "/mcp/up") as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("slow", {"seconds": 5})
            return info.value

    error = asyncio.run(scenario())
    assert "did not" in error.error.message
    url = gw.url
    labels = {"server": "up", "method": "tools/call", "tool": "slow"}
    assert sample(url, "gateway_mcp_requests_total", **labels, status="timeout") == 1


def test_the_live_view_lists_tool_calls_beside_model_calls(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, extra="[ui]\nenabled = true\n"))
    import openai

    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    client.close()
    assert asyncio.run(_echo(gw.url + "/mcp/up")) == "traced"
    records = httpx2.get(gw.url + "/_gateway/api/requests", timeout=5).json()["requests"]
    (call,) = [r for r in records if (r.get("mcp") or {}).get("method") == "tools/call"]
    assert call["mcp"]["tool"] == "echo" and call["mcp"]["server"] == "up"
    assert call["mcp"]["status"] == "ok" and len(call["mcp"]["session"]) == 32
    assert call["backend"] == "up" and call["path"] == "/mcp/up"
    assert any(r["path"] == "/v1/chat/completions" and "mcp" not in r for r in records)
