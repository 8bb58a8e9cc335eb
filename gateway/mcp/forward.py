"""``/mcp/{server}``: one upstream MCP server, relayed (docs/spec.md §23).

::

    POST    one JSON-RPC message → the server (a request without a string or integer id:
            400); its JSON or SSE answer relayed event by event until the request's answer
            (``tools/call`` of a denied tool: a JSON-RPC error, never forwarded; every result
            that carries tools, whatever its id: the denied tools dropped)
    GET     the server's notification stream, relayed event by event until either side ends
    DELETE  ends the session here and upstream

The client's ``Mcp-Session-Id`` is the gateway's; the upstream's stays in the session record.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gateway.headers import header_value
from gateway.hops.edge import read_body
from gateway.mcp.exchange import (
    DENIED,
    AnswerRelay,
    bounded,
    read_json,
    rpc_error,
    send,
    start_attempt,
)
from gateway.mcp.hub import Hub, McpRequest, Rejected, parse
from gateway.mcp.servers import McpUpstream
from gateway.mcp.sessions import Session
from gateway.streaming.relay import until_disconnect


def denied(rid: Any, tool: Any) -> Rejected:
    text = f"tool {tool!r} is not allowed for this API key on this gateway"
    body = rpc_error(rid, DENIED, text, {"type": "permission_error", "code": "tool_not_allowed"})
    return Rejected(200, body, "denied")


async def post(hub: Hub, call: McpRequest, up: McpUpstream) -> None:
    ctx, facts = call.ctx, call.ctx.mcp
    body = await read_body(ctx, call.receive, up.config.max_message_bytes)
    msg = parse(body)
    hub.adopt(call, msg)
    method, rid = msg.get("method"), msg.get("id")
    facts["method"] = method if isinstance(method, str) else "response"
    facts["id"] = rid
    if method == "tools/call":
        params = msg.get("params")
        tool = params.get("name") if isinstance(params, dict) else None
        facts["tool"] = tool if isinstance(tool, str) else None
        if not hub.allowed(call.grant, up, tool):
            raise denied(rid, tool)
        await hub.count(call)
    session = await hub.session(call, up.name)
    span_id = hub.tracing.new_span_id()
    headers = up.headers(call.headers) + hub.trace_headers(call, span_id)
    if session is not None and session.upstream.get(up.name, [""])[0]:
        headers.append(("mcp-session-id", session.upstream[up.name][0]))
    if facts.get("tool") is not None and any(k == "mcp-name" for k, _ in headers):
        # the routing header says what the body says: the tool that was checked (2026-07-28)
        headers = [(k, v) for k, v in headers if k != "mcp-name"] + [("mcp-name", facts["tool"])]
    attempt = start_attempt(ctx, up, span_id, facts["method"])
    body = hub.inject(call, msg, span_id)
    relay = AnswerRelay(ctx, up, attempt, call.out, rid, partial(hub.allowed, call.grant, up))

    async def exchange() -> None:
        resp = await send(ctx, up, attempt, "POST", headers, body)
        client_sid = session.id if session is not None else None
        if method == "initialize" and resp.status == 200:
            upstream_sid = header_value(resp.headers, b"mcp-session-id")
            if upstream_sid:  # the client gets the gateway's id, bound to its key
                made = Session(call.grant.owner, up.name, {up.name: [upstream_sid.decode(), ""]})
                await hub.sessions.put(made)
                client_sid = facts["session"] = made.id
        elif resp.status == 404 and session is not None:  # ended upstream: forget it here
            await hub.sessions.delete(session.id)
        await relay.answer(resp, client_sid)

    await until_disconnect(ctx, call.receive, bounded(up, exchange(), relay))


async def stream(hub: Hub, call: McpRequest, up: McpUpstream) -> None:
    """GET: the server's notification stream, relayed until either side ends."""
    ctx, facts = call.ctx, call.ctx.mcp
    facts["method"] = "stream"
    session = await hub.session(call, up.name)
    span_id = hub.tracing.new_span_id()
    headers = up.headers(call.headers) + hub.trace_headers(call, span_id)
    if session is not None and session.upstream.get(up.name, [""])[0]:
        headers.append(("mcp-session-id", session.upstream[up.name][0]))
    attempt = start_attempt(ctx, up, span_id, "stream")
    relay = AnswerRelay(ctx, up, attempt, call.out, None, partial(hub.allowed, call.grant, up))

    async def relayed() -> None:
        resp = await send(ctx, up, attempt, "GET", headers, None, stream=True)
        if resp.status == 405:  # the server offers no stream (MCP Streamable HTTP)
            await read_json(ctx, up, attempt, resp)
            await call.no_stream()
            return
        await relay.answer(resp, session.id if session is not None else None)

    await until_disconnect(ctx, call.receive, relayed())
    call.client_ended_stream()


async def end(hub: Hub, call: McpRequest, up: McpUpstream) -> None:
    """DELETE: the session ends here and upstream."""
    ctx, facts = call.ctx, call.ctx.mcp
    facts["method"] = "session/delete"
    session = await hub.session(call, up.name)
    if session is None:
        await call.out.whole(400, [], b"")
        return
    await hub.sessions.delete(session.id)
    upstream_sid = session.upstream.get(up.name, [""])[0]
    if not upstream_sid:
        await call.out.whole(200, [], b"")
        return
    span_id = hub.tracing.new_span_id()
    headers = [*up.headers(call.headers), ("mcp-session-id", upstream_sid)]
    attempt = start_attempt(ctx, up, span_id, "session/delete")

    async def ended() -> None:
        resp = await send(ctx, up, attempt, "DELETE", headers, None)
        await read_json(ctx, up, attempt, resp)
        await call.out.whole(resp.status, [], b"")

    await bounded(up, ended())


__all__ = ["end", "post", "stream"]
