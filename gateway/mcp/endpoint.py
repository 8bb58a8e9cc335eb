"""The MCP endpoints of one runtime: ``/mcp/{server}`` and ``/mcp`` (docs/spec.md §23).

Each HTTP request is a request like any other — the request scope (edge, errors in the OpenAI
shape, 499, the root span, the access-log line, the live view) — with its MCP facts on
``ctx.mcp``::

    Origin (403) → key (401) → body (413, JSON-RPC parse errors: 400) → tool allowed?
    (a JSON-RPC error, never forwarded) → rpm for a tool call (429) → session (404)
    → upstream (the span's id in params._meta.traceparent) → answer relayed
    → gateway_mcp_requests_total, gateway_mcp_request_duration_seconds

Nothing of this runs on the model-call path: the app dispatches ``/mcp*`` here by path.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from gateway.config import Config
from gateway.errors import ClientGone, Forbidden, GatewayError, MethodNotAllowed
from gateway.mcp import aggregate, forward
from gateway.mcp.hub import Hub, McpRequest, Rejected
from gateway.mcp.sessions import Sessions, build_sessions
from gateway.memo import remember
from gateway.runtime import Endpoint, Runtime
from gateway.types import Receive, Scope, Send

#: the ``method`` label's values; any other method counts as "other" (bounded)
METHODS = frozenset(
    {
        "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
        "resources/templates/list", "prompts/list", "prompts/get", "completion/complete",
        "logging/setLevel", "server/discover", "notifications/initialized",
        "notifications/cancelled", "notifications/progress", "notifications/roots/list_changed",
        "response", "stream", "session/delete",
    }
)  # fmt: skip
#: distinct ``tool`` label values kept per process before the rest count as "other"
MAX_TOOL_LABELS = 500


class McpGateway:
    def __init__(self, rt: Runtime, sessions: Sessions | None = None) -> None:
        self.rt = rt
        self.hub = Hub(rt, sessions=sessions)
        metrics = rt.telemetry.metrics
        self._metrics = metrics.mcp if metrics is not None else None
        self._tools: dict[tuple[str, str], bool] = {}

    async def __call__(
        self, server: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        hub = self.hub
        up = hub.upstreams.get(server) if server is not None else None
        async with self.rt.request(scope, send) as req:
            ctx = req.ctx
            facts = ctx.mcp = {"server": server or "*", "method": None, "tool": None}
            try:
                origins = up.config.allowed_origins if up is not None else hub.aggregate_origins
                call = McpRequest(ctx, req.out, receive, hub.begin(ctx, origins))
                call.note_revision()
                if up is not None and not call.grant.server(up.name):
                    raise Forbidden(
                        f"this API key may not use the MCP server {up.name!r}",
                        code="mcp_server_not_allowed",
                    )
                method = ctx.method
                if method == "POST":
                    await (forward.post(hub, call, up) if up else aggregate.post(hub, call))
                elif method == "GET":
                    await (forward.stream(hub, call, up) if up else aggregate.stream(hub, call))
                elif method == "DELETE":
                    await (forward.end(hub, call, up) if up else aggregate.end(hub, call))
                else:
                    raise MethodNotAllowed(
                        f"{method} is not served on {ctx.path}", allow="GET, POST, DELETE"
                    )
            except Rejected as exc:  # a JSON-RPC error answer of the gateway's own
                facts["status"] = exc.label
                json = [(b"content-type", b"application/json")]
                await req.out.whole(exc.status, json, exc.body)
            except GatewayError as exc:
                facts.setdefault("error", exc.code or exc.type)
                if facts.get("status") is None:
                    facts["status"] = "rejected" if exc.status < 500 else "upstream_error"
                if exc.status == 504:
                    facts["status"] = "timeout"
                raise
            except ClientGone:
                facts.setdefault("status", "cancelled")
                raise
            finally:
                if ctx.disconnected and not facts.get("status"):
                    facts["status"] = "cancelled"
                if not facts.get("status"):
                    facts["status"] = "ok"
        self._count(ctx.mcp, ctx.timeline.received, ctx.timeline.done)

    def _count(self, facts: dict[str, Any] | None, received: float, done: float | None) -> None:
        m = self._metrics
        if m is None or facts is None:
            return
        server = str(facts.get("server") or "*")
        method = facts.get("method")
        label = method if isinstance(method, str) and method in METHODS else "other"
        tool = facts.get("tool")
        tool_label = ""
        if isinstance(tool, str):
            known = self._tools.get((server, tool))
            if known is None:
                known = len(self._tools) < MAX_TOOL_LABELS
                remember(self._tools, (server, tool), known, MAX_TOOL_LABELS * 2)
            tool_label = tool if known else "other"
        status = str(facts.get("status") or "ok")
        m.requests.inc((server, label, tool_label, status))
        end = done if done is not None else time.perf_counter()
        m.duration.observe((server, label), end - received)

    async def aclose(self) -> None:
        await self.hub.aclose()


class McpEndpoints:
    """The app's ``/mcp`` and ``/mcp/{server}`` endpoints (none without ``[[mcp_servers]]``):
    one :class:`McpGateway` per runtime snapshot, made by its first MCP request and closed
    when the snapshot is retired (docs/spec.md §29); the client sessions are the app's, kept
    across reloads, closed with the app."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._mcp: dict[int, McpGateway] = {}
        self._sessions: Sessions | None = None

    def endpoints(self, config: Config | None = None) -> dict[str, Endpoint]:
        servers = (config or self.config).mcp_servers
        if not servers:
            return {}
        table: dict[str, Endpoint] = {"/mcp": partial(self._call, None)}
        for server in servers:
            table[f"/mcp/{server.name}"] = partial(self._call, server.name)
        return table

    async def _call(
        self, server: str | None, rt: Runtime, scope: Scope, receive: Receive, send: Send
    ) -> None:
        mcp = self._mcp.get(id(rt))
        if mcp is None:
            if self._sessions is None:
                self._sessions = build_sessions(rt.config)
            mcp = self._mcp[id(rt)] = McpGateway(rt, self._sessions)
            rt.closers.append(partial(self._forget, id(rt)))
        await mcp(server, scope, receive, send)

    async def _forget(self, key: int) -> None:
        mcp = self._mcp.pop(key, None)
        if mcp is not None:
            await mcp.aclose()

    async def aclose(self) -> None:
        for key in list(self._mcp):
            await self._forget(key)
        sessions, self._sessions = self._sessions, None
        if sessions is not None:
            await sessions.aclose()


__all__ = ["McpEndpoints", "McpGateway"]
