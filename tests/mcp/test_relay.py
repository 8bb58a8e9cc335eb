"""``/mcp/{server}`` and ``/mcp`` driven by the official ``mcp`` SDK client through a real gateway
to a real ``MCPServer`` on loopback (docs/spec.md §23)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.mcp.mcp_support import (
    KEY,
    UPSTREAM_TOKEN,
    McpUpstream,
    keys_section,
    mcp_client,
    mcp_config,
)


@pytest.fixture
def mcp_upstream() -> Any:
    server = McpUpstream().start()
    yield server
    server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_relay_lists_and_calls_tools_with_progress(gateway, mcp_upstream, mode):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))
    progress: list[tuple[float, float | None, str | None]] = []

    async def scenario() -> tuple[list[str], Any]:
        async with mcp_client(gw.url + "/mcp/up", mode=mode) as client:
            tools = await client.list_tools()

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append((p, total, message))

            result = await client.call_tool("echo", {"text": "hi"}, progress_callback=on_progress)
            return [t.name for t in tools.tools], result

    names, result = run(scenario())
    assert sorted(names) == ["add", "announce", "echo", "slow"]  # "secret" is denied by the config
    assert result.content[0].text == "hi" and not result.is_error
    assert progress == [(1.0, 2.0, "half way")]  # the SSE progress event was relayed
    call = mcp_upstream.calls("tools/call")[-1]
    # the server's credentials are the config's; the session id the server made stays hidden
    assert call.headers["authorization"] == f"Bearer {UPSTREAM_TOKEN}"
    assert call.headers["x-tools-key"] == "tools-header-from-config"


def test_a_denied_tool_is_a_jsonrpc_error_and_never_forwarded(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))

    async def scenario() -> MCPError:
        async with mcp_client(gw.url + "/mcp/up") as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("secret", {})
            return info.value

    error = run(scenario())
    assert error.error.code == -32602 and "not allowed" in error.error.message
    assert mcp_upstream.calls("tools/call") == []


def test_session_ids_are_the_gateways_and_bound_to_the_key(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=keys_section()))
    url = gw.url + "/mcp/up"
    init = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    accept = {"accept": "application/json, text/event-stream"}
    with httpx2.Client(timeout=10) as http:
        assert http.post(url, json=init, headers=accept).status_code == 401
        r = http.post(url, json=init, headers={**accept, "authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
        sid = r.headers["mcp-session-id"]
        upstream_sid = [s for s in mcp_upstream.seen if s.method == "POST"]
        assert sid not in {s.headers.get("mcp-session-id") for s in upstream_sid}
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        mine = {**accept, "authorization": f"Bearer {KEY}", "mcp-session-id": sid}
        assert http.post(url, json=ping, headers=mine).status_code == 200
        # another tenant's key may not use this session (nor this server)
        from tests.mcp.mcp_support import OTHER_KEY

        theirs = {**mine, "authorization": f"Bearer {OTHER_KEY}"}
        r = http.post(url, json=ping, headers=theirs)
        assert r.status_code == 403 and r.json()["error"]["code"] == "mcp_server_not_allowed"
        r = http.post(url, json=ping, headers={**mine, "mcp-session-id": "0" * 32})
        assert r.status_code == 404 and r.json()["error"]["code"] == "mcp_session_not_found"
        r = http.delete(url, headers=mine)
        assert r.status_code == 200
        assert http.post(url, json=ping, headers=mine).status_code == 404
        assert [s.method for s in mcp_upstream.seen][-1] == "DELETE"


def test_aggregate_merges_tools_and_routes_calls(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))

    async def scenario() -> tuple[list[str], str, str]:
        async with mcp_client(gw.url + "/mcp", mode="auto") as client:
            tools = await client.list_tools()
            echoed = await client.call_tool("up__echo", {"text": "via /mcp"})
            now = await client.call_tool("builtin__time", {})
            return [t.name for t in tools.tools], echoed.content[0].text, now.content[0].text

    names, echoed, now = run(scenario())
    assert sorted(names) == [
        "builtin__echo", "builtin__time", "up__add", "up__announce", "up__echo", "up__slow"
    ]  # fmt: skip
    assert echoed == "via /mcp" and now.startswith("20")
    # the upstream got the tool's own name
    assert mcp_upstream.calls("tools/call")[-1].json()["params"]["name"] == "echo"


def test_origin_is_validated(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with httpx2.Client(timeout=10) as http:
        r = http.post(gw.url + "/mcp/up", json=ping, headers={"origin": "https://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        r = http.post(gw.url + "/mcp", json=ping, headers={"origin": "http://localhost:5173"})
        assert r.status_code == 200
    assert mcp_upstream.seen == []


def test_bad_bodies_get_clear_errors(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, server_extra="max_message_bytes = 1000"))
    url = gw.url + "/mcp/up"
    with httpx2.Client(timeout=10) as http:
        r = http.post(url, content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        r = http.post(url, json=[{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600
        r = http.post(url, content=b"x" * 2000)
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"
        r = http.put(url, content=b"{}")
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST, DELETE"
    assert mcp_upstream.seen == []


def test_the_embedded_default_serves_the_builtin_server(gateway):
    from gateway.config import load_config

    gw = gateway(load_config(env={}))
    progress: list[float] = []

    async def scenario() -> tuple[list[str], str, str]:
        async with mcp_client(gw.url + "/mcp", mode="auto") as client:
            names = [t.name for t in (await client.list_tools()).tools]

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)

            echoed = await client.call_tool(
                "builtin__echo", {"text": "hello"}, progress_callback=on_progress
            )
            now = await client.call_tool("builtin__time", {})
            return names, echoed.content[0].text, now.content[0].text  # type: ignore[union-attr]

    names, echoed, now = run(scenario())
    assert names == ["builtin__echo", "builtin__time"]
    assert echoed == "hello" and now.startswith("20") and progress == [1.0]


def test_a_keys_tool_globs_narrow_the_list_and_the_calls(gateway, mcp_upstream):
    extra = keys_section(tools='["up__add", "builtin__*"]')
    gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=extra))

    async def scenario() -> tuple[list[str], list[str], int]:
        async with mcp_client(gw.url + "/mcp/up", KEY) as client:
            one = [t.name for t in (await client.list_tools()).tools]
            with pytest.raises(MCPError) as info:
                await client.call_tool("echo", {"text": "no"})
        async with mcp_client(gw.url + "/mcp", KEY) as client:
            merged = [t.name for t in (await client.list_tools()).tools]
        return one, merged, info.value.error.code

    one, merged, code = run(scenario())
    assert one == ["add"] and code == -32602
    assert sorted(merged) == ["builtin__echo", "builtin__time", "up__add"]
    assert mcp_upstream.calls("tools/call") == []


def test_a_dead_server_is_a_502_and_left_out_of_the_merged_list(gateway):
    from tests.support import free_port

    dead = f"http://127.0.0.1:{free_port()}/mcp"
    gw = gateway(mcp_config(dead))
    init = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    with httpx2.Client(timeout=10) as http:
        r = http.post(gw.url + "/mcp/up", json=init)
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error"

    async def scenario() -> list[str]:
        async with mcp_client(gw.url + "/mcp") as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert run(scenario()) == ["builtin__echo", "builtin__time"]


def test_the_routing_header_names_the_tool_that_was_checked(gateway, mcp_upstream):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
    }
    with httpx2.Client(timeout=10) as http:
        for tool, named in (("secret", "secret"), ("add", "secret")):
            params = {"name": tool, "arguments": {"a": 1, "b": 2}, "_meta": meta}
            body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
            r = http.post(gw.url + "/mcp/up", json=body, headers={**headers, "mcp-name": named})
            assert r.status_code == 200
    (call,) = mcp_upstream.calls("tools/call")  # "secret" never went
    assert call.json()["params"]["name"] == "add" and call.headers["mcp-name"] == "add"


@pytest.mark.parametrize("path", ["/mcp/up", "/mcp"])
def test_list_changed_notifications_reach_the_client(gateway, mcp_upstream, path):
    gw = gateway(mcp_config(mcp_upstream.mcp_url))
    tool = "announce" if path == "/mcp/up" else "up__announce"

    async def scenario() -> list[str]:
        seen: list[str] = []
        changed = asyncio.Event()

        async def on_message(message: Any) -> None:
            method = getattr(getattr(message, "root", message), "method", None)
            if isinstance(method, str):
                seen.append(method)
                if method == "notifications/tools/list_changed":
                    changed.set()

        async with mcp_client(gw.url + path, message_handler=on_message) as client:
            await client.list_tools()
            # the GET stream is open once the server has it: announce until it arrives
            async with asyncio.timeout(20):
                while not changed.is_set():
                    await client.call_tool(tool, {})
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), 0.5)
        return seen

    seen = run(scenario())
    assert "notifications/tools/list_changed" in seen
