"""Real MCP servers built with the official ``mcp`` SDK's ``MCPServer``, served by uvicorn on a
loopback port, and the SDK's own client (``streamable_http_client``) pointed at the gateway.

The upstream records what reached it (method, headers, JSON body) so a test can prove what
was — and was not — forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer

from gateway.config import Config
from tests.support import ThreadedServer, gateway_config

KEY = "sk-mcp-client-key"
OTHER_KEY = "sk-mcp-other-tenant"
UPSTREAM_TOKEN = "tool-server-token-from-config"
os.environ["TEST_MCP_UPSTREAM_TOKEN"] = UPSTREAM_TOKEN
#: a second credential of the tool server, sent as a header of its own (headers_env)
os.environ["TEST_MCP_TOOLS_HEADER"] = "tools-header-from-config"


class Seen:
    """One request as the upstream MCP server received it."""

    def __init__(self, method: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def tool_server(name: str = "up") -> MCPServer:
    srv = MCPServer(name)

    @srv.tool()
    async def echo(text: str, ctx: Context) -> str:
        """Echo the text, after a progress notification."""
        await ctx.report_progress(1, 2, "half way")
        return text

    @srv.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @srv.tool()
    def secret() -> str:
        """A tool the gateway's config denies."""
        return "the secret"

    @srv.tool()
    async def announce(ctx: Context) -> str:
        """Tell the client (on its GET stream) that the tool list changed."""
        await ctx.session.send_tool_list_changed()
        return "announced"

    @srv.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "done"

    return srv


class McpUpstream(ThreadedServer):
    """An ``MCPServer`` behind uvicorn, recording every request."""

    def __init__(self, name: str = "up") -> None:
        self.seen: list[Seen] = []
        app = tool_server(name).streamable_http_app()

        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            parts: list[bytes] = []
            done = False

            async def reading() -> Any:
                nonlocal done
                message = await receive()
                parts.append(message.get("body", b""))
                if not message.get("more_body") and not done:
                    done = True
                    headers = {k.decode(): v.decode() for k, v in scope["headers"]}
                    self.seen.append(Seen(scope["method"], headers, b"".join(parts)))
                return message

            if scope["method"] != "POST":
                headers = {k.decode(): v.decode() for k, v in scope["headers"]}
                self.seen.append(Seen(scope["method"], headers, b""))
                await app(scope, receive, send)
                return
            await app(scope, reading, send)

        super().__init__(recorded)

    @property
    def mcp_url(self) -> str:
        return self.url + "/mcp"

    def calls(self, method: str) -> list[Seen]:
        return [s for s in self.seen if s.body and (s.json() or {}).get("method") == method]


def mcp_config(upstream_url: str, extra: str = "", server_extra: str = "") -> Config:
    """A gateway with the mock model backend and two MCP servers: ``up`` (the SDK server,
    ``secret`` denied) and ``builtin`` (the gateway's own)."""
    return gateway_config(
        f"""
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
models = ["*"]
backends = ["mock"]

[[mcp_servers]]
name = "up"
url = "{upstream_url}"
api_key_env = "TEST_MCP_UPSTREAM_TOKEN"
headers_env = ["X-Tools-Key=TEST_MCP_TOOLS_HEADER"]
tools_deny = ["secret"]
{server_extra}

[[mcp_servers]]
name = "builtin"
url = "mock://"
{extra}
"""
    )


def keys_section(rpm: int | None = None, tools: str = '["*"]') -> str:
    rpm_line = f"rpm = {rpm}" if rpm is not None else ""
    return f"""
[auth]
mode = "keys"

[[auth.keys]]
tenant = "team-a"
sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
mcp_servers = ["*"]
mcp_tools = {tools}
{rpm_line}

[[auth.keys]]
tenant = "team-b"
sha256 = "{hashlib.sha256(OTHER_KEY.encode()).hexdigest()}"
mcp_servers = ["builtin"]
"""


@contextlib.asynccontextmanager
async def mcp_client(
    url: str, key: str | None = None, mode: str = "legacy", **kwargs: Any
) -> AsyncIterator[Client]:
    """The official SDK client over Streamable HTTP, with the gateway key as a bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client,  # type: ignore[arg-type]
    ):
        yield client


class Alternating(httpx2.AsyncBaseTransport):
    """Sends each request to the next of several gateway replicas (their ports, in turn)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.sent: list[int] = []
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[len(self.sent) % len(self.ports)]
        self.sent.append(port)
        request.url = request.url.copy_with(port=port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
