"""A key of the key store carries its MCP grant (docs/spec.md §23, §28): none unless listed,
its tools as globs over ``{server}__{tool}``, narrowed by its tenant's; changed at runtime."""

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
