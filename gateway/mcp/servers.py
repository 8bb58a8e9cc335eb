"""One upstream MCP server: its pooled transports and its credentials (docs/spec.md §23).

The gateway's own HTTP/1.1 client (:mod:`gateway.transports`) carries MCP too, so an MCP
request's upstream window is taken at the socket like a model call's. Two pools per server:
POSTs, whose every read waits at most ``timeout_s``, and the long-lived ``GET`` notification
streams, which may stay quiet for an hour. ``url = "mock://"`` is the built-in server
(:mod:`gateway.mock.mcp`), in process.

Credentials come from the config only (``api_key_env`` as ``Authorization: Bearer``,
``headers_env``): of what the client sent, only the MCP protocol headers go on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

from gateway.config import BackendConfig, McpServerConfig
from gateway.mock.mcp import BuiltinMcpServer
from gateway.routes import Backend, bearer_from_env
from gateway.transports import Transport, for_backend

log = logging.getLogger("gateway")

#: the client's headers that go upstream (lower-case); everything else stays here
FORWARDED = frozenset(
    {"accept", "content-type", "mcp-protocol-version", "mcp-method", "mcp-name", "last-event-id"}
)
#: a GET stream may be quiet this long before the gateway ends it (the client reconnects)
STREAM_IDLE_S = 3600.0


class McpUpstream:
    __slots__ = ("backend", "config", "credentials", "name", "streams", "transport", "url")

    def __init__(self, cfg: McpServerConfig, env: Mapping[str, str]) -> None:
        self.config = cfg
        self.name = cfg.name
        self.url = cfg.url
        connect_s = min(5.0, cfg.timeout_s)
        post = BackendConfig(
            f"mcp:{cfg.name}", cfg.url, provider="mcp", connect_timeout_s=connect_s,
            read_timeout_s=cfg.timeout_s, max_connections=100,
        )  # fmt: skip
        if cfg.url.startswith("mock:"):
            builtin = cast(Transport, BuiltinMcpServer())
            self.transport = self.streams = builtin
        else:
            self.transport = for_backend(post)
            get = BackendConfig(
                f"mcp:{cfg.name}", cfg.url, provider="mcp", connect_timeout_s=connect_s,
                read_timeout_s=STREAM_IDLE_S, max_connections=100,
            )  # fmt: skip
            self.streams = for_backend(get)
        #: names the attempts (spans, metrics) as the server
        self.backend = Backend(post, self.transport, {})
        self.backend.name = cfg.name
        creds = bearer_from_env(env, cfg.api_key_env, f"mcp server {cfg.name}")
        for spec in cfg.headers_env:
            header, _, var = spec.partition("=")
            value = env.get(var.strip())
            if value:
                creds.append((header.strip().lower(), value))
            else:
                log.warning("mcp server %s: env var %s is not set", cfg.name, var.strip())
        self.credentials = tuple(creds)

    def headers(self, client: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
        """The client's MCP protocol headers, then this server's credentials."""
        out = [
            (k.decode("latin-1").lower(), v.decode("latin-1"))
            for k, v in client
            if k.decode("latin-1").lower() in FORWARDED
        ]
        out.extend(self.credentials)
        return out

    async def aclose(self) -> None:
        await self.transport.aclose()
        if self.streams is not self.transport:
            await self.streams.aclose()


__all__ = ["FORWARDED", "McpUpstream"]
