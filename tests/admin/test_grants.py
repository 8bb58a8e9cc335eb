"""A key of the key store carries its grants (docs/spec.md §23, §26, §28, §30): MCP servers
and tools, unmodelled paths, agents — none unless listed, narrowed by its tenant's, changed at
runtime."""

from __future__ import annotations

import asyncio

import httpx2

from tests.admin.admin_support import admin, admin_toml
from tests.mcp.mcp_support import mcp_client
from tests.support import GatewayServer, gateway_config

BUILTIN = '[[mcp_servers]]\nname = "builtin"\nurl = "mock://"\n'
INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}},
}  # fmt: skip


def tools(url: str, key: str) -> list[str]:
    async def listed() -> list[str]:
        async with mcp_client(url + "/mcp/builtin", key) as client:
            return sorted(t.name for t in (await client.list_tools()).tools)

    return asyncio.run(listed())


def initialize(url: str, key: str) -> httpx2.Response:
    headers = {"accept": "application/json, text/event-stream", "authorization": f"Bearer {key}"}
    return httpx2.post(f"{url}/mcp/builtin", json=INIT, headers=headers, timeout=10)


def test_a_stored_keys_mcp_grant(gateway, tmp_path):
    toml = admin_toml(admin_extra=f'data_dir = "{tmp_path}"') + BUILTIN
    gw: GatewayServer = gateway(gateway_config(toml))
    plain = admin(gw.url, "POST", "keys", {"tenant": "t"}).json()
    refused = initialize(gw.url, plain["key"])
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "mcp_server_not_allowed"
    grant = {"mcp_servers": ["builtin"], "mcp_tools": ["builtin__echo"]}
    assert admin(gw.url, "PATCH", f"keys/{plain['id']}", grant).status_code == 200
    assert tools(gw.url, plain["key"]) == ["echo"]
    everything = admin(gw.url, "POST", "keys", {"tenant": "lab", "mcp_servers": ["*"]}).json()
    assert len(tools(gw.url, everything["key"])) > 1
    # the tenant narrows its keys' grant
    admin(gw.url, "POST", "tenants", {"name": "lab", "mcp_tools": ["builtin__echo"]})
    assert tools(gw.url, everything["key"]) == ["echo"]


def test_a_stored_keys_passthrough_and_agent_grants(gateway, tmp_path):
    agents = '[[agents]]\nname = "echo"\nurl = "mock://"\n'
    gw: GatewayServer = gateway(
        gateway_config(admin_toml(admin_extra=f'data_dir = "{tmp_path}"') + agents)
    )
    made = admin(gw.url, "POST", "keys", {"tenant": "t"}).json()
    auth = {"authorization": f"Bearer {made['key']}"}
    speech = {"model": "tts-1", "input": "hi", "voice": "alloy"}

    def unmodelled() -> httpx2.Response:
        return httpx2.post(f"{gw.url}/v1/audio/speech", json=speech, headers=auth, timeout=10)

    def listed() -> list[str]:
        answer = httpx2.get(f"{gw.url}/a2a", headers=auth, timeout=10).json()
        return [a["name"] for a in answer["data"]]

    refused = unmodelled()
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "passthrough_not_allowed"
    assert listed() == []
    grants = {"passthrough": ["/v1/audio/*"], "agents": ["echo"]}
    assert admin(gw.url, "PATCH", f"keys/{made['id']}", grants).status_code == 200
    assert (unmodelled().json().get("error") or {}).get("code") != "passthrough_not_allowed"
    assert listed() == ["echo"]
    bad = admin(gw.url, "PATCH", f"keys/{made['id']}", {"passthrough": ["audio"]})
    assert bad.status_code == 400
