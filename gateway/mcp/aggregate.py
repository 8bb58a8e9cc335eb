"""``/mcp``: every MCP server the caller may use, behind one endpoint (docs/spec.md §23).

The gateway answers ``initialize`` itself (its session, bound to the caller's key) and opens a
session on an upstream server only when a request needs it (its handshake is an attempt of
that request, with its own span). ``tools/list`` asks every allowed server at once and merges
their tools, named ``{server}__{tool}``; a server that fails is left out of the list (logged),
the others still answer. ``tools/call`` goes to the owning server under the tool's own name,
its answer (JSON, or SSE with progress notifications) relayed as from ``/mcp/{server}``. An
upstream's SSE answer to a request the gateway makes on its own (a handshake, a ``tools/list``
page) is read only until the event that answers it, as ``/mcp/{server}`` relays one: a server
that keeps the stream open after answering holds nobody up.
"""

from __future__ import annotations

import asyncio
import logging
import os
from functools import partial
from typing import Any

import orjson

from gateway import __version__
from gateway.context import Attempt
from gateway.errors import GatewayError, UpstreamError
from gateway.headers import header_value
from gateway.hops.edge import read_body
from gateway.mcp.access import SEPARATOR
from gateway.mcp.exchange import (
    SSE,
    AnswerRelay,
    bounded,
    read_answer,
    read_json,
    rpc_error,
    send,
    start_attempt,
)
from gateway.mcp.forward import denied
from gateway.mcp.hub import METHOD_NOT_FOUND, Hub, McpRequest, Rejected, kind, parse
from gateway.mcp.servers import McpUpstream
from gateway.mcp.sessions import Session
from gateway.streaming.relay import until_disconnect
from gateway.streaming.sse import SSEParser, event_data
from gateway.transports import UpstreamResponse

log = logging.getLogger("gateway")

VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
#: what the gateway asks of an upstream when it opens a session there
UPSTREAM_VERSION = "2025-06-18"
MAX_PAGES = 20
_EMPTY = {"resources/list": "resources", "resources/templates/list": "resourceTemplates"}
_EMPTY["prompts/list"] = "prompts"


async def post(hub: Hub, call: McpRequest) -> None:
    ctx, facts, out = call.ctx, call.ctx.mcp, call.out
    cap = max((u.config.max_message_bytes for u in hub.upstreams.values()), default=1 << 20)
    msg = parse(await read_body(ctx, call.receive, cap))
    hub.adopt(call, msg)
    method, rid = msg.get("method"), msg.get("id")
    facts["method"] = method if isinstance(method, str) else "response"
    facts["id"] = rid
    if method == "initialize":
        await _initialize(hub, call, msg)
    elif kind(msg) != "request":  # notifications and answers: nothing upstream waits for them
        await out.whole(202, [], b"")
    elif method == "ping":
        await _result(call, rid, {})
    elif method == "tools/list":
        session = await _session(hub, call)
        await _result(call, rid, {"tools": await _list(hub, call, session)})
    elif method == "tools/call":
        await _call(hub, call, msg)
    elif isinstance(method, str) and method in _EMPTY:
        await _result(call, rid, {_EMPTY[method]: []})
    else:  # server/discover included: a 2026 client then falls back to initialize
        text = f"method not found: {method!r} (the gateway's /mcp serves tools)"
        raise Rejected(200, rpc_error(rid, METHOD_NOT_FOUND, text), "error")


async def _result(call: McpRequest, rid: Any, result: dict[str, Any]) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})
    await call.out.whole(200, [(b"content-type", b"application/json")], body)


async def _session(hub: Hub, call: McpRequest) -> Session:
    session = await hub.session(call, "*")
    if session is None:
        text = "send Mcp-Session-Id: initialize first"
        raise Rejected(400, rpc_error(None, -32600, text), "rejected")
    return session


async def _initialize(hub: Hub, call: McpRequest, msg: dict[str, Any]) -> None:
    params = msg.get("params")
    asked = params.get("protocolVersion") if isinstance(params, dict) else None
    session = Session(call.grant.owner, "*")
    await hub.sessions.put(session)
    call.ctx.mcp["session"] = session.id
    result = {
        "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
        "capabilities": {"tools": {"listChanged": True}},
        "serverInfo": {"name": "llm-gateway", "version": __version__},
        "instructions": "Tools of every MCP server this key may use, named {server}__{tool}.",
    }
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": result})
    headers = [(b"content-type", b"application/json"), (b"mcp-session-id", session.id.encode())]
    await call.out.whole(200, headers, body)


def request_id() -> str:
    """The id of a request the gateway makes on its own: never used before in the upstream
    session (MCP: a requestor MUST NOT reuse an id within a session), whichever replica sends
    it."""
    return "gateway-" + os.urandom(8).hex()


def _headers(up: McpUpstream, sid: str, version: str) -> list[tuple[str, str]]:
    headers = [("accept", "application/json, text/event-stream")]
    headers.append(("content-type", "application/json"))
    if sid:
        headers.append(("mcp-session-id", sid))
    if version:
        headers.append(("mcp-protocol-version", version))
    return headers + list(up.credentials)


async def _ask(
    hub: Hub, call: McpRequest, up: McpUpstream, headers: list[tuple[str, str]], msg: dict[str, Any]
) -> tuple[dict[str, Any], Any]:
    """One request the gateway makes on its own; its result and the response's headers."""
    span_id = hub.tracing.new_span_id()
    attempt = start_attempt(call.ctx, up, span_id, str(msg.get("method")))
    body = hub.inject(call, msg, span_id)
    resp = await send(
        call.ctx, up, attempt, "POST", headers + hub.trace_headers(call, span_id), body
    )
    rid = msg.get("id")
    if rid is None or resp.status >= 400:  # a notification's 202, or a refusal: read whole
        await read_json(call.ctx, up, attempt, resp)
        if resp.status >= 400:
            text = f"the MCP server {up.name!r} answered {resp.status}"
            raise UpstreamError(text, code="mcp_error")
        return {}, resp.headers
    answer = await read_answer(call.ctx, up, attempt, resp, rid)
    if answer is None:
        raise UpstreamError("the MCP server sent no answer", code="mcp_no_answer")
    if isinstance(answer.get("result"), dict):
        return dict(answer["result"]), resp.headers
    raise UpstreamError(f"the MCP server answered {answer.get('error')!r}", code="mcp_error")


async def _open(hub: Hub, call: McpRequest, session: Session, up: McpUpstream) -> list[str]:
    """The session's upstream session on ``up``, opened (initialize) when it has none — once:
    concurrent requests of one session (its GET stream and its first tools/list) wait for the
    first one's handshake and use its session, which is stored before the lock is let go."""
    have = session.upstream.get(up.name)
    if have is not None:
        return have
    async with hub.opening(session.id, up.name):
        stored = await hub.sessions.get(session.id)
        if stored is not None:  # what other requests (or replicas) opened meanwhile
            session.upstream = {**stored.upstream, **session.upstream}
        have = session.upstream.get(up.name)
        if have is not None:
            return have
        init = {
            "jsonrpc": "2.0", "id": request_id(), "method": "initialize",
            "params": {
                "protocolVersion": UPSTREAM_VERSION, "capabilities": {},
                "clientInfo": {"name": "llm-gateway", "version": __version__},
            },
        }  # fmt: skip
        result, headers = await _ask(hub, call, up, _headers(up, "", ""), init)
        sid = (header_value(headers, b"mcp-session-id") or b"").decode("latin-1")
        version = str(result.get("protocolVersion") or UPSTREAM_VERSION)
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await _ask(hub, call, up, _headers(up, sid, version), done)
        session.upstream[up.name] = [sid, version]
        await hub.sessions.put(session)
        return session.upstream[up.name]


async def _list(hub: Hub, call: McpRequest, session: Session) -> list[dict[str, Any]]:
    names = [n for n in hub.upstreams if call.grant.server(n)]
    lists = await asyncio.gather(
        *(_list_one(hub, call, session, hub.upstreams[n]) for n in names), return_exceptions=True
    )
    tools: list[dict[str, Any]] = []
    for name, got in zip(names, lists, strict=True):
        if isinstance(got, BaseException):
            if not isinstance(got, Exception):
                raise got
            log.warning("mcp: tools/list of server %s failed: %s", name, got)
            continue
        tools.extend(got)
    return tools


async def _list_one(
    hub: Hub, call: McpRequest, session: Session, up: McpUpstream
) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]]:
        sid, version = await _open(hub, call, session, up)
        out: list[dict[str, Any]] = []
        cursor = None
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            msg = {"jsonrpc": "2.0", "id": request_id(), "method": "tools/list", "params": params}
            result, _ = await _ask(hub, call, up, _headers(up, sid, version), msg)
            for tool in result.get("tools") or ():
                if isinstance(tool, dict) and hub.allowed(call.grant, up, tool.get("name")):
                    out.append({**tool, "name": f"{up.name}{SEPARATOR}{tool['name']}"})
            cursor = result.get("nextCursor")
            if not cursor:
                break
        return out

    result: list[dict[str, Any]] = await bounded(up, listed())
    return result


async def _call(hub: Hub, call: McpRequest, msg: dict[str, Any]) -> None:
    ctx, facts = call.ctx, call.ctx.mcp
    rid = msg.get("id")
    params = msg.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    server, _, tool = name.partition(SEPARATOR) if isinstance(name, str) else ("", "", "")
    up = hub.upstreams.get(server)
    facts["tool"] = tool or None
    if up is not None:
        facts["server"] = up.name
    if up is None or not hub.allowed(call.grant, up, tool):
        raise denied(rid, name)
    await hub.count(call)
    session = await _session(hub, call)
    assert isinstance(params, dict)
    relay = AnswerRelay(ctx, up, None, call.out, rid, partial(hub.allowed, call.grant, up))

    async def exchange() -> None:
        sid, version = await _open(hub, call, session, up)
        span_id = hub.tracing.new_span_id()
        relay.attempt = attempt = start_attempt(ctx, up, span_id, "tools/call")
        body = hub.inject(call, {**msg, "params": {**params, "name": tool}}, span_id)
        headers = _headers(up, sid, version) + hub.trace_headers(call, span_id)
        resp = await send(ctx, up, attempt, "POST", headers, body)
        await relay.answer(resp, session.id)

    await until_disconnect(ctx, call.receive, bounded(up, exchange(), relay))


#: the upstream notification ``GET /mcp`` passes on (other messages name upstream requests or
#: sessions the client does not know), and the event it is passed on as: the gateway's own
#: bytes, never the server's (its other members could carry anything)
FORWARDED = "notifications/tools/list_changed"
_LIST_CHANGED = (
    b'event: message\ndata: {"jsonrpc":"2.0","method":"' + FORWARDED.encode() + b'"}\n\n'
)


async def stream(hub: Hub, call: McpRequest) -> None:
    """GET /mcp: the servers' notification streams, merged: their ``tools/list_changed``
    notifications reach the client (its session is opened on every allowed server first).
    When no server offers a stream the answer is the one a server gives: 405 (``no_stream``),
    as on ``/mcp/{server}``."""
    ctx, out = call.ctx, call.out
    ctx.mcp["method"] = "stream"
    session = await _session(hub, call)
    names = [n for n in hub.upstreams if call.grant.server(n)]
    opened = await asyncio.gather(
        *(bounded(hub.upstreams[n], _open(hub, call, session, hub.upstreams[n])) for n in names),
        return_exceptions=True,
    )
    ups = [
        hub.upstreams[n]
        for n, got in zip(names, opened, strict=True)
        if not isinstance(got, BaseException) and session.upstream[n][0]
    ]
    asked = await asyncio.gather(
        *(bounded(up, _stream_of(hub, call, up, session)) for up in ups), return_exceptions=True
    )
    streams = [got for got in asked if isinstance(got, tuple)]
    if not streams:
        await call.no_stream()
        return
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)
    follows = [asyncio.ensure_future(_follow(a, r, queue)) for _, a, r in streams]
    headers = [(b"content-type", SSE), (b"cache-control", b"no-cache")]
    headers += [(b"mcp-session-id", session.id.encode()), (b"x-accel-buffering", b"no")]

    async def relayed() -> None:
        await out.start(200, headers)
        while True:
            await out.body(await queue.get(), more=True)

    try:  # the servers' streams end with the client's, whatever ends it
        await until_disconnect(ctx, call.receive, relayed())
    finally:
        for task in follows:
            task.cancel()
        await asyncio.gather(*follows, return_exceptions=True)
    call.client_ended_stream()


async def _stream_of(
    hub: Hub, call: McpRequest, up: McpUpstream, session: Session
) -> tuple[McpUpstream, Attempt, UpstreamResponse] | None:
    """A server's notification stream (its GET answered 200), or None: it offers none (405),
    or it failed (logged)."""
    sid, version = session.upstream[up.name]
    headers = [("accept", "text/event-stream"), *_headers(up, sid, version)[2:]]
    span_id = hub.tracing.new_span_id()
    attempt = start_attempt(call.ctx, up, span_id, "stream")
    try:
        resp = await send(call.ctx, up, attempt, "GET", headers, None, stream=True)
    except GatewayError as exc:
        log.warning("mcp: the notification stream of server %s failed: %s", up.name, exc.message)
        return None
    if resp.status == 200:
        return up, attempt, resp
    await read_json(call.ctx, up, attempt, resp)
    if resp.status != 405:  # 405: the server offers no stream, as MCP allows
        log.warning("mcp: server %s answered %d to its notification stream", up.name, resp.status)
    return None


async def _follow(attempt: Attempt, resp: UpstreamResponse, queue: asyncio.Queue[bytes]) -> None:
    try:
        parser = SSEParser()
        async for chunk in resp.aiter_raw():
            for event in parser.feed(chunk):
                if _list_changed(event_data(event)):
                    await queue.put(_LIST_CHANGED)
    except GatewayError:
        return
    finally:
        attempt.finished()
        await resp.aclose()


def _list_changed(data: bytes | None) -> bool:
    """Whether an event of a server's notification stream is its tools/list_changed."""
    if data is None or b"list_changed" not in data:
        return False
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(msg, dict) and msg.get("method") == FORWARDED and "id" not in msg


async def end(hub: Hub, call: McpRequest) -> None:
    """DELETE /mcp: the session ends here and on every server it was opened on."""
    call.ctx.mcp["method"] = "session/delete"
    session = await _session(hub, call)
    await hub.sessions.delete(session.id)
    for name, (sid, version) in session.upstream.items():
        up = hub.upstreams.get(name)
        if up is None or not sid:
            continue
        span_id = hub.tracing.new_span_id()
        attempt = start_attempt(call.ctx, up, span_id, "session/delete")
        try:
            resp = await bounded(
                up, send(call.ctx, up, attempt, "DELETE", _headers(up, sid, version), None)
            )
            await read_json(call.ctx, up, attempt, resp)
        except GatewayError as exc:  # the client's session is over whatever the server says
            log.warning("mcp: ending the session on server %s failed: %s", name, exc.message)
    await call.out.whole(200, [], b"")


__all__ = ["end", "post"]
